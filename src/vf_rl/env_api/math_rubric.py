"""MathRubric: is the model's final answer mathematically equal to the reference?"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from vf_rl.config.packages import require
from vf_rl.env_api.parsers import Parser, extract_boxed_answer, last_assistant_text
from vf_rl.env_api.rubric import Rubric
from vf_rl.parent_watch import start_parent_watch

VERIFY_TIMEOUT_S = 5
"""math-verify's own limit on parsing and on comparing one answer (seconds)."""
HARD_TIMEOUT_S = 60.0
"""Longest wait for one comparison in the worker process (seconds) before the worker is killed:
math-verify's timeout cannot stop a computation inside C (``10^{10^{10}}``)."""

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _verify(predicted: str, reference: str) -> bool:
    """math-verify's verdict, with its own ``SIGALRM`` timeouts: call only from a main thread."""
    from math_verify import parse, verify

    def parsed(text: str):  # as LaTeX math first, else as written
        return parse(f"${text}$", parsing_timeout=VERIFY_TIMEOUT_S) or parse(text, parsing_timeout=VERIFY_TIMEOUT_S)

    try:
        gold, answer = parsed(reference), parsed(predicted)
        return bool(gold and answer and verify(gold, answer, timeout_seconds=VERIFY_TIMEOUT_S))
    except BaseException:  # math-verify's TimeoutException derives from BaseException
        return False


def _verify_in_worker(predicted: str, reference: str) -> bool:
    """:func:`_verify` in a worker process's main thread (one spawned worker, started on first use,
    shared by every thread, ending with this process); a comparison past ``HARD_TIMEOUT_S`` kills
    the worker and is False."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=start_parent_watch)
        pool = _pool
    try:
        return pool.submit(_verify, predicted, reference).result(timeout=HARD_TIMEOUT_S)
    except Exception:  # a timeout (concurrent.futures.TimeoutError) or a broken worker
        with _pool_lock:
            if _pool is pool:
                for process in list(getattr(pool, "_processes", {}).values()):
                    process.kill()
                pool.shutdown(wait=False, cancel_futures=True)
                _pool = None
        return False


def math_equal(predicted: str | None, reference: str) -> bool:
    """Symbolic equality with HuggingFace's ``math-verify`` (LaTeX and plain expressions;
    ``1/2 == 0.5``, ``\\frac{1}{2} == 0.5``). ``False`` for a missing prediction, an error or a
    timeout.

    math-verify bounds its work with ``SIGALRM``, which only a main thread can set: elsewhere it
    fails and every answer would score 0. So off the main thread (an orchestrator's event loop,
    a thread pool) the comparison runs in a worker process, as verifiers' ``MathRubric`` does."""
    if predicted is None or not str(predicted).strip():
        return False
    predicted, reference = str(predicted).strip(), str(reference).strip()
    if predicted == reference:
        return True
    if threading.current_thread() is threading.main_thread():
        return _verify(predicted, reference)
    return _verify_in_worker(predicted, reference)


class MathRubric(Rubric):
    """Reward 1 when the parsed answer (default: the last ``\\boxed{}``) equals ``answer``.

    Args:
        parser: extracts the answer; default takes the last ``\\boxed{...}`` of the last
            assistant message.
    """

    def __init__(self, funcs=None, weights=None, parser: Parser | None = None):
        require("math_verify", "math-verify", "envs", "MathRubric (the gsm8k and math-python environments)")
        super().__init__(funcs=funcs, weights=weights, parser=parser or BoxedParser())
        self.add_reward_func(self.correct_answer_reward_func)

    async def correct_answer_reward_func(self, completion, answer, **kwargs: Any) -> float:
        """1.0 if the parsed answer equals the reference answer (math-verify), else 0.0. Runs
        in a thread, so that a slow comparison does not hold up the other rollouts."""
        equal = await asyncio.to_thread(math_equal, self.parser.parse_answer(completion), str(answer))
        return 1.0 if equal else 0.0


class BoxedParser(Parser):
    """The answer is the last ``\\boxed{...}`` of the last assistant message."""

    def parse(self, text: str) -> str | None:
        return extract_boxed_answer(text)

    def parse_answer(self, completion) -> str | None:
        return self.parse(last_assistant_text(completion))

    def format_answer(self, answer: str) -> str:
        """``\\boxed{answer}``."""
        return f"\\boxed{{{answer}}}"
