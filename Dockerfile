# The GPU worker image: `vela2 worker` (Celery, one process per GPU) on a CUDA PyTorch base image.
#   docker build -t vela2-worker .
#   docker run --gpus device=0 -v /srv/ckpt:/models/ckpt:ro vela2-worker worker --checkpoint /models/ckpt ...
# torch comes from the base image and pip must not replace it (a PyPI wheel would bring its own CUDA
# stack, or a CPU build): the install below pins torch to the image's own version. Pick a base whose
# torch is inside pyproject's range (torch>=2.11,<2.15); the build fails loudly when it is not.
FROM pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    CUDA_DEVICE_ORDER=PCI_BUS_ID

WORKDIR /opt/vela2
COPY pyproject.toml constraints.txt README.md ./
COPY vela2 ./vela2
COPY worker ./worker
COPY producer ./producer
COPY stack ./stack

# constraints.txt pins the tested versions of everything else; its torch line (the CPU CI pin) is
# replaced by the image's torch, so pip keeps the installed CUDA build instead of downloading one.
RUN TORCH_VERSION="$(python -c 'import torch; print(torch.__version__.split("+")[0])')" \
 && grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
 && echo "torch==${TORCH_VERSION}" >> /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt ".[worker]" \
 && python -c "import torch, worker, vela2; assert torch.__version__.startswith('${TORCH_VERSION}'); assert torch.version.cuda, 'torch lost its CUDA build'" \
 && rm -rf /tmp/constraints.txt /opt/vela2/build

COPY deploy/launch-workers.sh /usr/local/bin/vela2-launch-workers
RUN chmod 0755 /usr/local/bin/vela2-launch-workers \
 && useradd --create-home --uid 10001 --user-group vela2 \
 && mkdir -p /cache/compile && chown -R vela2:vela2 /cache  # VELA2_COMPILE_CACHE_DIR's volume starts as this

USER vela2
WORKDIR /home/vela2

# Prometheus text at /metrics; with the launcher, worker k listens on 9464+k.
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('VELA2_METRICS_PORT', '9464'), timeout=5)"]

# SIGTERM = Celery's warm shutdown: stop taking messages, finish or requeue what is held, then exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["vela2"]
CMD ["worker", "--checkpoint", "/models/ckpt", "--device", "cuda:0", "--precision", "bf16", "--redis", "redis://redis:6379/0", "--visibility-timeout-s", "3600", "--metrics-port", "9464"]
