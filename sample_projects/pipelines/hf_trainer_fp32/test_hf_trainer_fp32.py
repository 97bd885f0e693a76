"""Fault: a GPT-2 trained through the Hugging Face Trainer in full fp32: tensor cores unused.

The model (random weights from a ``GPT2Config``: 8 blocks of width 1024, nothing downloaded) and
the corpus (token ids from ``torch.randint`` over a fixed Markov chain) are as in the healthy
Trainer sample, but ``TrainingArguments`` leaves ``bf16`` off (its default) and PyTorch's
float32 matmul precision is "highest" (its default): every matrix product of the GPU-bound
step runs on the plain fp32 units. The loader is set up right (2 workers, pinned memory).

Expected diagnosis: GT106, whose fix names the Trainer's setting
(``TrainingArguments(bf16=True)``, or ``tf32=True``). Skipped without transformers and
accelerate (``pip install pytest-gputrain[frameworks]``).
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
BATCH_SIZE = 16
STEPS = 40


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


def train(output_dir: str, steps: int, *, cpu: bool = False, layers: int = 8, width: int = 1024,
          length: int = SEQ_LEN, batch_size: int = BATCH_SIZE, vocab: int = VOCAB,
          workers: int = 2) -> list[float]:
    """Train a random-initialised GPT-2 with the Trainer in fp32; returns the logged losses."""
    transformers.set_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=length, n_embd=width,
                                     n_layer=layers, n_head=max(1, width // 64))
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=5e-4, warmup_steps=steps // 10, use_cpu=cpu,  # fault: bf16 left off
        dataloader_num_workers=workers, dataloader_pin_memory=not cpu,
        dataloader_persistent_workers=workers > 0, logging_steps=max(1, steps // 4),
        save_strategy="no", report_to="none", disable_tqdm=True)
    corpus = MarkovTokens(batch_size * steps, length, vocab)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=corpus)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt2_fp32_loss_goes_down(tmp_path: Path) -> None:
    losses = train(str(tmp_path), STEPS)
    print(f"logged losses {losses}")
    assert losses[-1] < losses[0]
