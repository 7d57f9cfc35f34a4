"""The demo checkpoint: a small Qwen2-layout scorer trained on synthetic customer messages, with a
tokenizer counted offline on generated text. `vela2 init-demo DIR` builds it: seeded random
weights (`untrained_demo_model`), then `vela2 train`'s own code path (`vela2.train.training`) on rows of
`vela2.train.synthetic` (`RECIPE`), the calibration fitted on a dev split; everything runs on a fresh
machine with no download, deterministically (one CPU thread, seeded weights, rows and batch order).
The checkpoint carries a one-line `description.txt` saying what it is and what it does not know
(`vela2 demo` prints it).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from vela2.config import HeadsConfig, SpecialTokens, Vela2Config
from vela2.model.calibration import Calibration, PiiRules
from vela2.model.checkpoint import release_state_dict
from vela2.model.modeling import Vela2Model

logger = logging.getLogger(__name__)

DEMO_NAME = "vela2-demo"
SEED = 20261129
TOKENIZER_SEED = 7  # the synthetic messages the tokenizer's vocabulary is counted on
DESCRIPTION_FILE = "description.txt"  # one line: what the model is (printed by `vela2 demo`)
DESCRIPTION = ("a 2-layer demo scorer trained on synthetic customer messages: it knows e-mails, phone numbers, "
               "names and companies, intents, sentiments, satisfaction, topics, insults and threats, and nothing else "
               "(a model of your own: README, \"Using a real model\")")

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
    """A WordPiece tokenizer over a vocabulary counted in plain Python (the `tokenizers` trainer
    breaks ties differently from run to run, so it is not used) on `corpus()` and on synthetic
    customer messages (`vela2.train.synthetic.texts`, a seed of its own), so that the words, names,
    companies and e-mail domains of the demo's training data are whole tokens: special tokens (ids
    0..7), printable ASCII characters and their `##` continuations, then the lower-cased words seen
    at least twice, most frequent first (ties alphabetically), each also as a `##` continuation
    (an e-mail's local part, "carollewis55", splits into carol ##lewis ##5 ##5).
    Unknown characters become [UNK].
    """
    from vela2.train.synthetic import texts  # local: vela2.train.synthetic is plain Python, the demo only uses it here

    special = SpecialTokens().all()
    chars = [chr(c) for c in range(33, 127)]
    vocab = [*special, *chars, *[f"##{c}" for c in chars]]
    counts: dict[str, int] = {}
    pre = pre_tokenizers.BertPreTokenizer()
    for line in corpus() + texts(2000, seed=TOKENIZER_SEED):
        for word, _ in pre.pre_tokenize_str(line.lower()):
            if len(word) > 1:
                counts[word] = counts.get(word, 0) + 1
    frequent = sorted((w for w, c in counts.items() if c >= 2), key=lambda w: (-counts[w], w))
    room = max(0, vocab_size - len(vocab))
    words = frequent[: room // 2]
    vocab.extend([*words, *[f"##{w}" for w in words]])
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
        "hidden_size": 128,
        "intermediate_size": 256,
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


# Messages of the kind the demo model was trained on (vela2.train.synthetic's templates and slots), and
# what each sample row's answer should be: tests check the trained model gets them right.
_DELIVERY = ("Hi, my name is Maria Lopez from Globex. Where is my package, it has not arrived yet. The app crashes "
             "on my laptop after the update. Your support is awful and slow. You can reach me at "
             "maria.lopez12@example.com or call +1-555-201-7788.")
_REFUND = ("Hello, this is Chen Garcia at Initech. I would like a refund for my last order. My bank card was charged "
           "twice for the invoice. Thanks a lot, your team was great. Write to chen_garcia7@mail.test or phone "
           "(415) 555-0142.")
_ANGRY = ("Dear team, I am Tara King working for Hooli. Cancel the membership, I no longer need it. The pizza and the "
          "salad arrived cold. This is terrible and I am very angry. You are all useless idiots. Fix it or I will "
          "come to your office and hurt you. Contact: taraking3@inbox.example.org, tel. +44 20 7946 5321 today.")
SAMPLE_EXPECTED: dict[str, Any] = {  # row id -> the decision of each question, in order
    "demo-choice": ["delivery"],
    "demo-score": ["4"],
    "demo-set": [["insult", "threat"]],
    "demo-pii": [{"person": ["Chen Garcia"], "company": ["Initech"], "email": ["chen_garcia7@mail.test"],
                  "phone": ["(415) 555-0142"]}],
    "demo-bundle": ["negative", "food", {"person": ["Tara King"], "company": ["Hooli"],
                                         "email": ["taraking3@inbox.example.org"], "phone": ["+44 20 7946 5321"]}],
}


def sample_rows() -> list[dict]:
    """A few rows of every type over customer messages like the training data's (the demo and the README
    use them; `SAMPLE_EXPECTED` says what the answers should be)."""
    from vela2.train.synthetic import QUESTIONS

    return [
        {"id": "demo-choice", "task": "choice:intent", "text": _DELIVERY, "questions": [QUESTIONS["choice:intent"]]},
        {"id": "demo-score", "task": "score:satisfaction", "text": _REFUND,
         "questions": [QUESTIONS["score:satisfaction"]]},
        {"id": "demo-set", "task": "set:toxicity", "text": _ANGRY, "questions": [QUESTIONS["set:toxicity"]]},
        {"id": "demo-pii", "task": "span:pii", "text": _REFUND, "questions": [QUESTIONS["span:pii"]]},
        {"id": "demo-bundle", "task": "choice:sentiment", "text": _ANGRY,
         "questions": [QUESTIONS["choice:sentiment"], dict(QUESTIONS["choice:topic"], task="choice:topic"),
                       dict(QUESTIONS["span:pii"], task="span:pii")]},
        {"id": "demo-long", "task": "span:pii", "text": " ".join([_REFUND] * 40),
         "questions": [QUESTIONS["span:pii"]]},
    ]


def untrained_demo_model() -> Vela2Model:
    """The demo model before training: seeded random weights, backbone matmul weights rounded to
    bf16 (as a checkpoint stores them). Tests of `vela2 train` start from it."""
    tok = demo_tokenizer()
    # initializer_range 0.1 (transformers' default: 0.02): with tiny weights a small model trained from
    # scratch sits for hundreds of steps on a plateau where every option of a question scores the same
    config = demo_config(vocab_size=tok.get_vocab_size(), initializer_range=0.1)
    model = Vela2Model.random(config, tok, demo_calibration(), seed=SEED)
    with torch.no_grad():
        model.load_state_dict(release_state_dict(model))
    return model


@dataclass(frozen=True)
class DemoRecipe:
    """How the demo is trained: synthetic rows (`vela2.train.synthetic.labelled_rows`) and `vela2 train` options."""

    n_train: int = 1200  # training rows, every one bundled (all six questions over one text)
    train_seed: int = 1001
    n_dev: int = 300  # rows the calibration is fitted on
    dev_seed: int = 1002
    epochs: int = 10  # 5 and 8 swung with the start (intent or spans far under the goals in some seeds)
    lr: float = 3e-3  # in trial runs 5e-3 left intent and topic at chance
    max_batch_tokens: int = 2048  # ~10 bundled rows a step: ~1,200 steps in all
    lr_schedule: str = "linear"  # trial runs at a constant 2e-3..5e-3 left every choice question at chance
    seed: int = 0  # batch order


RECIPE = DemoRecipe()
HELD_OUT_SEED = 1003  # the README's table and the tests evaluate on HELD_OUT_ROWS rows of this seed
HELD_OUT_ROWS = 600


def build_demo_model(recipe: DemoRecipe | None = None) -> tuple[Vela2Model, dict[str, Any]]:
    """The demo model in memory, trained: `untrained_demo_model()`, then `vela2 train --full`'s code
    path on synthetic rows (`vela2.train.training.labelled_examples` and `train`, then the calibration
    fitted on a dev split by `vela2.train.training.finish`). Returns (model, {"epoch_losses", "train_s"}).
    Deterministic on one machine: seeded weights, seeded rows and batch order, CPU."""
    from vela2.train.synthetic import labelled_rows
    from vela2.train.training import TrainOptions, finish, labelled_examples, train

    recipe = recipe or RECIPE
    model = untrained_demo_model()
    examples, skipped = labelled_examples(model, labelled_rows(recipe.n_train, recipe.train_seed, bundled_share=1.0))
    if skipped:  # generated rows are valid: a skip is a bug in vela2.train.synthetic
        raise ValueError(f"synthetic training rows were skipped: {skipped[:3]}")
    options = TrainOptions(epochs=recipe.epochs, lr=recipe.lr, full=True, max_batch_tokens=recipe.max_batch_tokens,
                           lr_schedule=recipe.lr_schedule, seed=recipe.seed, progress=False)
    # One CPU thread: the sums of a matmul then add up in one order whatever the machine's core count
    # (same seed, same weights), and a busy shared machine does not stall two threads that wait on
    # each other (on 2 loaded cores two threads took several times as long as one).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        losses = train(model, examples, options)
        train_s = time.perf_counter() - t0
        finish(model, labelled_rows(recipe.n_dev, recipe.dev_seed), precision="fp32")
    finally:
        torch.set_num_threads(threads)
    return model, {"epoch_losses": losses, "train_s": train_s}


def init_demo(path: str | Path, recipe: DemoRecipe | None = None) -> Path:
    """Train the demo model (`build_demo_model`, `RECIPE` unless given) and write its checkpoint to
    `path` (deterministic), with its DESCRIPTION_FILE; returns the path."""
    from vela2.model.checkpoint import save

    path = Path(path)
    model, info = build_demo_model(recipe or RECIPE)
    logger.info("demo model trained in %.1f s; epoch losses %s", info["train_s"],
                ", ".join(f"{x:.4f}" for x in info["epoch_losses"]))
    save(model, path)
    (path / DESCRIPTION_FILE).write_text(DESCRIPTION + "\n")
    return path
