"""A mixed serving workload, from the corpus's test split (never trained on) unless told otherwise.

Three tasks, as the benchmarks and the demo need them:
- ``code`` — standard-library source (predictable, repetitive);
- ``prose`` — ``pydoc_data`` topic text;
- ``hard`` — prose with its bytes shuffled: little for any drafter to predict.
Prompts are drawn deterministically from a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .corpus import stdlib_corpus

TASKS = ("code", "prose", "hard")


@dataclass(frozen=True)
class Prompt:
    task: str
    tokens: list[int]


def mixed_workload(
    n: int,
    seed: int = 0,
    prompt_len: int = 96,
    mix: tuple[float, float, float] = (0.5, 0.35, 0.15),
    split: str = "test",
) -> list[Prompt]:
    """``n`` prompts of ``prompt_len`` tokens from ``split``, tasks drawn with weights ``mix``."""
    if n < 0 or prompt_len < 1:
        raise ValueError(f"need n >= 0 and prompt_len >= 1, got n={n}, prompt_len={prompt_len}")
    rng = random.Random(seed)
    corpus = stdlib_corpus()
    # Prompts are drawn with replacement: a pool of at least n keeps repeats rare.
    pools = {domain: corpus.prompts(split, domain, max(512, n), prompt_len) for domain in ("code", "prose")}
    prompts = []
    for task in rng.choices(TASKS, weights=mix, k=n):
        tokens = list(rng.choice(pools["code" if task == "code" else "prose"]))
        if task == "hard":
            rng.shuffle(tokens)
        prompts.append(Prompt(task, tokens))
    return prompts
