"""The rehearsal's stand-ins for what a CPU cannot run, each failing as the real one fails.

``engine`` is a stand-in SGLang server on 127.0.0.1 (stdlib HTTP) that answers every request
Miles sends an external engine; ``model`` its scripted SWE policy and SGLang 0.5.x's reply
shaping (or, with ``--policy``, the tiny model of ``rescue.rehearsal.tiny.policy``);
``weights`` its end of Miles' weight update by broadcast, on gloo; ``docker`` a stand-in
``docker`` executable whose containers are folder copies; ``tasks`` the tiny SWE-smith-shaped
task repositories it runs and the shim that puts it on ``PATH``. They import the standard
library, rescue's ``rehearsal.tiny`` (the engine's policy) and, inside the functions that use
them, tokenizers and torch (the weight update); never a framework.
"""
