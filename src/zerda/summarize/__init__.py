"""Summarizers: fold conversation turns into a running summary, by a model or offline.

``zerda.summarize`` is the layer below the summary memories; it imports only
``zerda.errors``, ``zerda.messages`` and ``zerda.tokens``. The ``openai`` package is needed
only by :class:`LLMSummarizer` without a ``client`` function, and imported only then.
"""

from __future__ import annotations

from zerda.summarize._base import (
    Summarizer,
    SummaryResult,
    arun_summarizer,
    render_messages,
    run_summarizer,
)
from zerda.summarize._extractive import ExtractiveSummarizer
from zerda.summarize._llm import DEFAULT_PROMPT, LLMSummarizer

__all__ = [
    "DEFAULT_PROMPT",
    "ExtractiveSummarizer",
    "LLMSummarizer",
    "Summarizer",
    "SummaryResult",
    "arun_summarizer",
    "render_messages",
    "run_summarizer",
]
