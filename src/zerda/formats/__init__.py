"""Messages to and from the providers' request formats: OpenAI Chat, OpenAI Responses,
Anthropic Messages and Gemini.

Each ``from_X`` reads what that format says and keeps, in ``extra`` and ``metadata`` under the
format's name, what Zerda does not model, so that ``to_X(from_X(p)) == p``. Each ``to_X`` gives
a request the provider accepts from any context a memory returns, whichever format its
messages came from: it leaves out what the provider cannot take and places messages where the
provider wants them. See ``docs/formats.md`` for the mapping of each format.
"""

from __future__ import annotations

from zerda.formats._anthropic import from_anthropic, to_anthropic
from zerda.formats._gemini import from_gemini, to_gemini
from zerda.formats._responses import from_responses, to_responses
from zerda.messages import from_openai, to_openai

__all__ = [
    "from_anthropic",
    "from_gemini",
    "from_openai",
    "from_responses",
    "to_anthropic",
    "to_gemini",
    "to_openai",
    "to_responses",
]
