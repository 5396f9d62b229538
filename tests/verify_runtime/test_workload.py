"""The mixed serving workload: prompts from the corpus split asked for, tasks by weight, fixed by the seed."""

import pytest

from sparkgate.verify_runtime.corpus import stdlib_corpus
from sparkgate.verify_runtime.workload import TASKS, mixed_workload


def test_prompts_come_from_the_test_split_and_hard_ones_are_shuffled_prose():
    prompts = mixed_workload(60, seed=3, prompt_len=24)
    assert len(prompts) == 60 and {p.task for p in prompts} == set(TASKS)
    assert all(len(p.tokens) == 24 for p in prompts)
    corpus = stdlib_corpus()
    pools = {domain: corpus.prompts("test", domain, 512, 24) for domain in ("code", "prose")}
    prose_sorted = {tuple(sorted(tokens)) for tokens in pools["prose"]}
    for prompt in prompts:
        if prompt.task == "hard":
            assert tuple(sorted(prompt.tokens)) in prose_sorted
        else:
            assert prompt.tokens in pools[prompt.task]


def test_the_seed_fixes_the_workload_and_the_mix_weights_the_tasks():
    assert mixed_workload(20, seed=5, prompt_len=16) == mixed_workload(20, seed=5, prompt_len=16)
    assert mixed_workload(20, seed=5, prompt_len=16) != mixed_workload(20, seed=6, prompt_len=16)
    assert {p.task for p in mixed_workload(30, seed=1, prompt_len=16, mix=(0.0, 1.0, 0.0))} == {"prose"}
    other = mixed_workload(20, seed=5, prompt_len=16, split="validation")
    assert other != mixed_workload(20, seed=5, prompt_len=16)
    assert mixed_workload(0) == []
    with pytest.raises(ValueError, match="prompt_len=0"):
        mixed_workload(3, prompt_len=0)
    with pytest.raises(ValueError, match="n=-1"):
        mixed_workload(-1)
