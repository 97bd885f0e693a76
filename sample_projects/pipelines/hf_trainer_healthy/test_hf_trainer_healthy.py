"""Healthy: a small GPT-2 trained through the Hugging Face Trainer, set up as its docs advise.

No fault. The model is built from a ``GPT2Config`` with random weights (GPT-2 small's 12 x 768
shape, an 8192-token vocabulary; nothing is downloaded); the corpus is token ids drawn with
``torch.randint`` from a fixed Markov chain (no tokenizer).
``TrainingArguments(bf16=True, dataloader_num_workers=2, dataloader_pin_memory=True,
dataloader_persistent_workers=True)``, batch 32 x 256 tokens, the Trainer's defaults otherwise:
its NaN/Inf loss filter (``logging_nan_inf_filter``) reads the loss back every step, which is
the Trainer's own habit and costs the host well under 1 % of the step.

Expected diagnosis: nothing at warning level (info may say the model is small for the GPU,
GT137, or that accelerate copies the pinned batches blocking, GT130). Skipped without
transformers and accelerate (``pip install pytest-gputrain[frameworks]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
_REASON = "needs transformers and accelerate: pip install 'pytest-gputrain[frameworks]'"
pytest.importorskip("accelerate", reason=_REASON)
transformers = pytest.importorskip("transformers", minversion="4.40", reason=_REASON)

VOCAB = 8192
SEQ_LEN = 256
BATCH_SIZE = 32
STEPS = 120


class MarkovTokens(torch.utils.data.Dataset):
    """Token sequences from a fixed random chain (each token has four likely successors): a
    model that learns the bigram table gets far below log(VOCAB)."""

    def __init__(self, n: int, length: int = SEQ_LEN, vocab: int = VOCAB, seed: int = 0) -> None:
        table = torch.Generator().manual_seed(1234)
        successors = torch.randint(vocab, (vocab, 4), generator=table)
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.empty(n, length, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (n,), generator=generator)
        for t in range(1, length):
            pick = torch.randint(4, (n,), generator=generator)
            tokens[:, t] = successors[tokens[:, t - 1], pick]
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids}  # GPT2LMHeadModel shifts the labels itself


def train(output_dir: str, steps: int, *, cpu: bool = False, layers: int = 12, width: int = 768,
          length: int = SEQ_LEN, batch_size: int = BATCH_SIZE, vocab: int = VOCAB,
          workers: int = 2) -> list[float]:
    """Train a random-initialised GPT-2 with the Trainer; returns the losses it logged."""
    transformers.set_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=length, n_embd=width,
                                     n_layer=layers, n_head=max(1, width // 64))
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=1e-3, warmup_steps=steps // 10, weight_decay=0.01,
        bf16=not cpu, use_cpu=cpu, dataloader_num_workers=workers,
        dataloader_pin_memory=not cpu, dataloader_persistent_workers=workers > 0,
        logging_steps=max(1, steps // 4), save_strategy="no", report_to="none",
        disable_tqdm=True)
    corpus = MarkovTokens(batch_size * steps, length, vocab)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=corpus)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt2_learns_the_chain(tmp_path: Path) -> None:
    losses = train(str(tmp_path), STEPS)
    print(f"logged losses {losses}")
    # The first logged loss averages the first quarter of the run (warm-up included): the test
    # asks for what a healthy run surely does, the last quarter's loss below the first's.
    assert losses[-1] < losses[0]
