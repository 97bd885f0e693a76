"""Healthy: short texts padded per batch (dynamic padding) under the Hugging Face Trainer.

No fault. The neighbour of ``hf_trainer_padded_to_max_length``: the same BERT-style classifier
(4 x 512 from a ``BertConfig``, nothing downloaded), the same texts (40 words on the median,
long-tailed) and ``TrainingArguments`` (``bf16=True``, batch 128, 4 pinned persistent loader
workers), but the texts are tokenized without padding and
``DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)`` pads each batch to its longest
example, as the Transformers documentation advises ("Data collators",
https://huggingface.co/docs/transformers/v5.10.1/data_collators).

Expected diagnosis: nothing at warning level. Skipped without transformers and accelerate
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
    encoding = tokenizer(texts, max_length=MAX_LENGTH, truncation=True)  # no padding here
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
    collator = transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Encoded(encoding, labels),
                                   data_collator=collator, processing_class=tokenizer)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bert_classifier_learns_the_topics(tmp_path: Path) -> None:
    losses = train(str(tmp_path))
    print(f"logged losses {losses}")
    assert losses[-1] < losses[0]
