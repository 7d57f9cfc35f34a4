"""The demo checkpoint: a small Qwen2-layout scorer with seeded random weights and a tokenizer
trained offline on generated text. `vela2 init-demo DIR` writes it; everything runs on a fresh
machine with no download. Its heads are scaled so that outputs are spread out (option logits with
std >= 1, a share of span units above 0.5) and every decode path is exercised.
The checkpoint carries a one-line `description.txt` saying what it is (`vela2 demo` prints it):
its answers mean nothing.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from vela2.calibration import Calibration, PiiRules
from vela2.config import HeadsConfig, SpecialTokens, Vela2Config
from vela2.modeling import Vela2Model

DEMO_NAME = "vela2-demo"
SEED = 20261129
DESCRIPTION_FILE = "description.txt"  # one line: what the model is (printed by `vela2 demo`)
RANDOM_DESCRIPTION = ("a 2-layer demo scorer with seeded RANDOM weights: its answers exercise every code path "
                      "and mean nothing (a model of your own: README, \"Using a real model\")")

_WORDS = """the of and to in is was for on that with as by at from it be this are or an have not
which but were his her they their has had been one all we there can more when who will would
about if out so up what into its no time than some only other new could two first may then do
any like people my over such our man me even most made after also did many before must through
years where much way well down should because each just those how too little state good very make
world still own see men work long get here between both life being under never day same another
know while last might us great old year off come since against go came right used take three
company market report price bank city police court party group water school health data system
question answer option label person email phone address account number name team game music film
sky green blue red yellow true false yes no maybe agree disagree neutral positive negative
score quality helpful harmful safe unsafe violence hate privacy medical legal finance sports
politics science technology travel food weather review product service customer support order
delivery refund payment card password login user assistant context message claim evidence source
fact check premise hypothesis entailment contradiction topic domain intent toxic insult threat
""".split()
_NAMES = "Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Maria Noah Olivia Paul".split()
_ORGS = "Acme Globex Initech Umbrella Hooli Vandelay Stark Wayne Wonka Cyberdyne".split()


def corpus(n_sentences: int = 4000, seed: int = SEED) -> list[str]:
    """Deterministic English-like training text for the demo tokenizer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 20))]
        if rng.random() < 0.4:
            words.insert(rng.randrange(len(words)), rng.choice(_NAMES))
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice(_ORGS))
        if rng.random() < 0.2:
            words.append(f"{rng.choice(_NAMES).lower()}@{rng.choice(_ORGS).lower()}.com")
        if rng.random() < 0.2:
            words.append(f"+1-555-{rng.randint(1000, 9999)}")
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ";"]))
    return out


def demo_tokenizer(vocab_size: int = 3000) -> Tokenizer:
    """A WordPiece tokenizer over a vocabulary counted from `corpus()` in plain Python (the
    `tokenizers` trainer breaks ties differently from run to run, so it is not used): special tokens
    (ids 0..7), printable ASCII characters and their `##` continuations, then the most frequent
    lower-cased words, ties broken alphabetically. Unknown characters become [UNK].
    """
    special = SpecialTokens().all()
    chars = [chr(c) for c in range(33, 127)]
    vocab = [*special, *chars, *[f"##{c}" for c in chars]]
    counts: dict[str, int] = {}
    pre = pre_tokenizers.BertPreTokenizer()
    for line in corpus():
        for word, _ in pre.pre_tokenize_str(line.lower()):
            if len(word) > 1:
                counts[word] = counts.get(word, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[: max(0, vocab_size - len(vocab))]
    vocab.extend(words)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token=SpecialTokens().unk,
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True)
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(special)
    return tok


def demo_config(name: str = DEMO_NAME, vocab_size: int = 3000, **backbone: object) -> Vela2Config:
    """Config of the demo model; `backbone` overrides Qwen2 config keys (benchmarks use 9B shapes)."""
    base: dict[str, Any] = {  # a transformers config dict (Vela2Config.backbone)
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    base.update(backbone)
    hidden = int(base["hidden_size"])
    return Vela2Config(name=name, backbone=base, heads=HeadsConfig(option_hidden=hidden, span_dim=min(hidden, 128)),
                       max_window_tokens=768, window_overlap_words=32, window_block_reserve_tokens=288)


def demo_calibration() -> Calibration:
    """Export defaults plus PII rules, so the length rule and the sparse gate have work to do."""
    return Calibration(
        pii=PiiRules(tasks=["pii*"], min_chars={"email": 6, "phone": 7}, min_words={"person": 1},
                     sparse_gate=0.8),
    )


def sample_rows() -> list[dict]:
    """A few rows of every type (used by the demo and the README)."""
    text = ("Alice Smith from Acme wrote to bob@globex.com on Monday. She asked whether the refund "
            "for order 4471 was sent, and said the support team was very helpful.")
    return [
        {"id": "demo-choice", "task": "choice:boolq", "text": "The sky is green over the city today.",
         "questions": [{"question": "Is the sky green?", "options": ["yes", "no"]}]},
        {"id": "demo-score", "task": "score:helpsteer2", "text": text,
         "questions": [{"question": "How helpful is the reply?", "options": ["0", "1", "2", "3", "4"]}]},
        {"id": "demo-set", "task": "set:shield", "text": "I will find where you live and hurt you.",
         "questions": [{"options": ["violence", "self-harm", "hate", "privacy"]}]},
        {"id": "demo-pii", "task": "span:pii_dev", "text": text,
         "questions": [{"labels": ["person", "email", "company", "phone"]}]},
        {"id": "demo-bundle", "task": "choice:oasst1", "text": text,
         "questions": [{"question": "Is the tone polite?", "options": ["yes", "no"]},
                       {"question": "What is the topic?", "options": ["finance", "sports", "support"]},
                       {"task": "span:ents", "labels": ["person", "company"]}]},
        {"id": "demo-long", "task": "span:pii_longdev", "text": " ".join([text] * 40),
         "questions": [{"labels": ["person", "email"]}]},
    ]


def build_demo_model() -> Vela2Model:
    """The demo model in memory: seeded weights, heads rescaled for spread-out outputs."""
    tok = demo_tokenizer()
    model = Vela2Model.random(demo_config(vocab_size=tok.get_vocab_size()), tok, demo_calibration(), seed=SEED)
    # Round backbone matmul weights to bf16 now, so the in-memory model equals the stored release.
    with torch.no_grad():
        for mod in model.backbone.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(mod.weight.to(torch.bfloat16).float())
    _spread_heads(model)
    return model


def _spread_heads(model: Vela2Model) -> None:
    """Point and scale the heads on sample text so every decode path has work to do.

    A random backbone's marker states are dominated by the marker token itself, so a random option
    head gives nearly equal logits to all options of a question. The demo head instead reads the
    direction in which options of one question differ most (top principal component of the
    within-question deviations of the head's hidden features), scaled to std 2, with [ABS] and set
    options landing near the decision boundary. Span head: std 2.5, ~15% of word units above 0.5.
    """
    from vela2.pipeline import collate, prepare
    from vela2.reference import predict  # local: it imports the model stack

    preps = [prepare(model, dict(r, logits=True, units=True)) for r in sample_rows()]
    seqs = [s for p in preps for s in p.sequences]
    ids, pos, parts, segs, idx, layout = collate(seqs, model.special_ids["pad"], model.device)
    with torch.no_grad():
        hidden = model.encode(ids, pos, parts, segs, "fp32")
        feats = torch.nn.functional.gelu(model.option_head.dense(hidden[idx.option_index[:, 0],
                                                                         idx.option_index[:, 1]]))
        deviations = []
        for seq, seq_opts in zip(seqs, layout.options, strict=True):
            kinds = {blk.question: blk.task.split(":")[0] for blk in seq.blocks}
            for q, sl in seq_opts:
                f = feats[sl][:-1] if kinds[q] in ("choice", "score") else feats[sl]  # without [ABS]
                deviations.append(f - f.mean(0))
        dev = torch.cat(deviations).double()
        direction = torch.linalg.svd(dev, full_matrices=False).Vh[0]  # (D,)
        direction = direction / (dev @ direction).std()
        out = model.option_head.out
        out.weight.copy_((2.0 * direction).float()[None])
        out.bias.zero_()
        out.bias.fill_(round(-float(out(feats).mean()), 4))
    res = predict(model, [p.row for p in preps], precision="fp32")
    span_logits: list[np.ndarray] = []
    for r in res:
        assert r.answers is not None, r.error  # the sample rows are valid, so every row is answered
        for a in r.answers:
            if a.units:
                assert a.units.logits is not None  # the rows asked for logits=True
                span_logits.extend(np.array(v) for v in a.units.logits.values())
    span = np.concatenate(span_logits)
    with torch.no_grad():
        k = round(2.5 / float(span.std()), 4)
        model.span_head.word.weight.mul_(k)
        model.span_head.word.bias.mul_(k)
        shifted = (span - model.span_head.bias.item()) * k
        model.span_head.bias.fill_(round(-float(np.quantile(shifted, 0.85)), 4))


def init_demo(path: str | Path) -> Path:
    """Write the demo checkpoint to `path` (deterministic), with its DESCRIPTION_FILE; returns the path."""
    from vela2.checkpoint import save

    path = Path(path)
    save(build_demo_model(), path)
    (path / DESCRIPTION_FILE).write_text(RANDOM_DESCRIPTION + "\n")
    return path
