import pytest
import torch

from sparkgate.verify_runtime.corpus import (
    DOMAINS,
    SPLITS,
    Corpus,
    Document,
    split_of,
    stdlib_corpus,
)
from sparkgate.verify_runtime.model import BOS


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return stdlib_corpus()


def test_real_splits_are_disjoint_non_empty_and_cover_every_document(corpus):
    names = {key: {d.name for d in docs} for key, docs in corpus.documents.items()}
    for domain in DOMAINS:
        seen = set()
        for split in SPLITS:
            assert names[(split, domain)], f"{split}/{domain} is empty"
            assert not seen & names[(split, domain)]
            seen |= names[(split, domain)]
    stats = corpus.stats()
    assert stats["splits"]["train"]["code"]["bytes"] > 5 * stats["splits"]["test"]["code"]["bytes"]
    # streams are the documents' bytes, each preceded by BOS
    for key, docs in corpus.documents.items():
        assert len(corpus.streams[key]) == 1 + sum(len(d.data) + 1 for d in docs)


def test_split_assignment_and_hash_are_deterministic(corpus):
    assert split_of("code", "json/decoder.py") == split_of("code", "json/decoder.py")
    docs = [Document("code", f"m{i}.py", f"x = {i}\n".encode()) for i in range(200)]
    docs += [Document("prose", f"t{i}", b"words " * i) for i in range(40)]
    a, b = Corpus(docs), Corpus(list(reversed(docs)))
    assert a.content_hash == b.content_hash  # independent of input order
    assert {k: [d.name for d in v] for k, v in a.documents.items()} == {
        k: [d.name for d in v] for k, v in Corpus(docs).documents.items()
    }
    changed = Corpus(docs[:-1] + [Document("prose", "t39", b"other")])
    assert changed.content_hash != a.content_hash
    assert stdlib_corpus.__wrapped__().content_hash == corpus.content_hash


def test_batches_and_prompts_are_deterministic(corpus):
    one = corpus.batch("train", 6, 33, torch.Generator().manual_seed(5), prose_fraction=0.5)
    two = corpus.batch("train", 6, 33, torch.Generator().manual_seed(5), prose_fraction=0.5)
    assert one.shape == (6, 33) and one.dtype == torch.long and torch.equal(one, two)
    assert int(one.max()) <= BOS and int(one.min()) >= 0
    prompts = corpus.prompts("test", "prose", 5, 40)
    assert len(prompts) == 5 and all(len(p) == 40 for p in prompts)
    assert prompts == corpus.prompts("test", "prose", 5, 40)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="domain must be one of"):
        Corpus([Document("poetry", "x", b"abc")])
    corpus = Corpus([Document("code", "a.py", b"abc")])
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.stream("dev", "code")
    with pytest.raises(ValueError, match="prose_fraction"):
        corpus.batch("train", 1, 2, torch.Generator(), prose_fraction=2.0)
