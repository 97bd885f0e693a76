"""Fault: gradient checkpointing left on under the Hugging Face Trainer, with memory to spare.

A GPT-2 (12 x 768 from a ``GPT2Config``, an 8192-token vocabulary; nothing is downloaded)
trains through the ``Trainer`` with ``TrainingArguments(gradient_checkpointing=True)``, copied
from the configuration of a larger run that needed it. Checkpointing keeps only each layer's
input and runs every layer's forward again during the backward: about a third more compute per
step. It buys memory, and this run has plenty: at 32 x 256 tokens its peak is a few GiB of the
GPU's 140. The training is simply slower than it needs to be.

Sources: the Transformers documentation, "GPU" in "Efficient training on a single GPU"
(gradient checkpointing "saves strategically selected activations ... so only a fraction of
the activations need to be re-computed" and slows training "by approximately 20%"),
https://huggingface.co/docs/transformers/perf_train_gpu_one#gradient-checkpointing, as quoted in
https://github.com/intel/intel-extension-for-pytorch/issues/470; and
https://github.com/stas00/ml-engineering/pull/64 (checkpointing "slows things down for the given
batch size", and pays only where the freed memory goes to a larger batch).

Fix: ``gradient_checkpointing=False`` (the default) while the peak leaves room; spend the room
on a larger ``per_device_train_batch_size`` instead.

A correct diagnosis names the gradient (activation) checkpointing, its recomputation cost, and
the memory headroom that makes it unnecessary. Skipped without transformers and accelerate
(``pip install pytest-gputrain[frameworks]``).
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
STEPS = 60


class MarkovTokens(torch.utils.data.Dataset):
    """Token sequences from a fixed random chain (each token has four likely successors)."""

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


def train(output_dir: str, steps: int = STEPS, *, cpu: bool = False, layers: int = 12,
          width: int = 768, length: int = SEQ_LEN, batch_size: int = BATCH_SIZE,
          workers: int = 2) -> list[float]:
    """Train a random-initialised GPT-2 with the Trainer; returns the losses it logged."""
    transformers.set_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=length, n_embd=width,
                                     n_layer=layers, n_head=max(1, width // 64), use_cache=False,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=1e-3, warmup_steps=steps // 10, weight_decay=0.01,
        bf16=not cpu, use_cpu=cpu, dataloader_num_workers=workers,
        dataloader_pin_memory=not cpu, dataloader_persistent_workers=workers > 0,
        gradient_checkpointing=True,  # fault: recomputes every layer; memory is plentiful here
        logging_steps=max(1, steps // 4), save_strategy="no", report_to="none",
        disable_tqdm=True)
    corpus = MarkovTokens(batch_size * steps, length)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=corpus)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt2_learns_the_chain(tmp_path: Path) -> None:
    losses = train(str(tmp_path))
    print(f"logged losses {losses}")
    assert losses[-1] < losses[0]
