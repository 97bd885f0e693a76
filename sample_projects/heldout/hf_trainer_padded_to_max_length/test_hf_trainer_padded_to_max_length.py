"""Fault: every example padded to ``max_length=512`` before the Hugging Face Trainer sees it.

A BERT-style classifier (4 x 512, built from a ``BertConfig``; nothing is downloaded) fine-tunes
through the ``Trainer`` on short texts: 40 words on the median, rarely more than 150. The
dataset is tokenized once, as many tutorials show, with ``tokenizer(texts, padding="max_length",
max_length=512, truncation=True)``. Every batch is then 128 x 512 tokens, nine in ten of them
``[PAD]``: the attention mask zeroes their effect on the result, not their cost. Each layer
computes on all 512 positions, attention on 512 x 512 of them; padding each batch to its
longest text would make the batches about 150 tokens long.

Sources: the Transformers documentation, "Data collators" (a collator "can also dynamically pad
samples to the longest sequence in each batch, which is more efficient than padding to a global
maximum length"), https://huggingface.co/docs/transformers/v5.10.1/data_collators; "Divide
Hugging Face Transformers training time by 2 or more with dynamic padding and uniform length
batching",
https://ai.lefebvre-sarrut.eu/2020/05/20/divide-hugging-face-transformers-training-time-by-2-or-more-with-dynamic-padding-and-uniform-length-batching/
(at 493 tokens, 4 h 38 min down to 1 h 01 min with both, same accuracy).

Fix: tokenize without padding and let ``DataCollatorWithPadding(tokenizer,
pad_to_multiple_of=8)`` pad each batch to its longest example (sample
``healthy_hf_trainer_dynamic_padding``); ``group_by_length=True`` for long-tailed lengths.

A correct diagnosis names the padding to ``max_length`` (the share of pad tokens in the batches)
as the cost. Skipped without transformers and accelerate
(``pip install pytest-gputrain[frameworks]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
_REASON = "needs transformers and accelerate: pip install 'pytest-gputrain[frameworks]'"
pytest.importorskip("accelerate", reason=_REASON)
transformers = pytest.importorskip("transformers", minversion="4.40", reason=_REASON)
tokenizers = pytest.importorskip("tokenizers", reason=_REASON)

WORDS = 2044  # with the four special tokens, a vocabulary of 2048
TOPIC_WORDS = 200
MAX_LENGTH = 512
BATCH_SIZE = 128
STEPS = 60


def word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer over the synthetic words, built in memory (nothing downloaded)."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    vocab.update({f"w{i}": i + 4 for i in range(WORDS)})
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    model.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]")


def reviews(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """Short texts of long-tailed length (median 40 words); the label decides which block of
    topic words half of them come from."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, (n,), generator=generator)
    lengths = (40 * torch.exp(0.5 * torch.randn(n, generator=generator))).clamp(4, 400).long()
    texts = []
    for label, length in zip(labels.tolist(), lengths.tolist(), strict=True):
        topical = label * TOPIC_WORDS + torch.randint(TOPIC_WORDS, (length,), generator=generator)
        noise = torch.randint(2 * TOPIC_WORDS, WORDS, (length,), generator=generator)
        words = torch.where(torch.rand(length, generator=generator) < 0.5, topical, noise)
        texts.append(" ".join(f"w{w}" for w in words.tolist()))
    return texts, labels.tolist()


class Encoded(torch.utils.data.Dataset):
    def __init__(self, encoding: transformers.BatchEncoding, labels: list[int]) -> None:
        self.encoding, self.labels = encoding, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, list[int] | int]:
        return {"input_ids": self.encoding["input_ids"][index],
                "attention_mask": self.encoding["attention_mask"][index],
                "labels": self.labels[index]}


def train(output_dir: str, steps: int = STEPS, *, cpu: bool = False, layers: int = 4,
          width: int = 512, batch_size: int = BATCH_SIZE, workers: int = 4) -> list[float]:
    """Fine-tune a random-initialised BERT with the Trainer; returns the losses it logged."""
    transformers.set_seed(0)
    tokenizer = word_tokenizer()
    texts, labels = reviews(batch_size * steps)
    # fault: every example padded to max_length when tokenized
    encoding = tokenizer(texts, padding="max_length", max_length=MAX_LENGTH, truncation=True)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=width, num_hidden_layers=layers,
        num_attention_heads=max(1, width // 64), intermediate_size=4 * width,
        max_position_embeddings=MAX_LENGTH, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=3e-4, warmup_steps=steps // 10, weight_decay=0.01,
        bf16=not cpu, use_cpu=cpu, dataloader_num_workers=workers,
        dataloader_pin_memory=not cpu, dataloader_persistent_workers=workers > 0,
        logging_steps=max(1, steps // 4), save_strategy="no", report_to="none",
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Encoded(encoding, labels),
                                   processing_class=tokenizer)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bert_classifier_learns_the_topics(tmp_path: Path) -> None:
    losses = train(str(tmp_path))
    print(f"logged losses {losses}")
    assert losses[-1] < losses[0]
