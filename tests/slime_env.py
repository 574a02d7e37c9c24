"""slime's rollout modules on a CPU, for the integration tests (``SLIME_SRC``).

``slime.rollout.sglang_rollout`` imports ``sglang_router`` and ``transformers``'
``AutoProcessor``/``AutoTokenizer``/``PreTrainedTokenizerBase``/``ProcessorMixin`` at import
time; a CPU test never calls them. Where those packages are not installed,
``slime_rollout_modules`` registers import-only stand-ins, as slime's own
``tests/test_fully_async_rollout.py`` does; nothing in slime's tree is touched.

``StubTokenizer`` is the tokenizer ``GenerateState`` loads (``load_tokenizer``): slime's
``generate()`` only calls its ``encode`` on the prompt of a sample that has no tokens yet.
"""

from __future__ import annotations

import sys
import types

from miles_env import require_slime

_TRANSFORMERS = ("AutoProcessor", "AutoTokenizer", "PreTrainedTokenizerBase", "ProcessorMixin")


def slime_rollout_modules() -> None:
    """slime's checkout on ``sys.path`` with the stand-ins its rollout modules need."""
    require_slime()
    for name, attrs in (
        ("sglang_router", {"__version__": "0.2.3"}),
        ("transformers", {n: type(n, (), {}) for n in _TRANSFORMERS}),
    ):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            for k, v in attrs.items():
                setattr(module, k, v)
            sys.modules[name] = module


class StubTokenizer:
    """``encode`` of a fixed three-token prompt (slime's ``_prepare_prompt_ids``)."""

    PROMPT = [1, 2, 3]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.PROMPT)
