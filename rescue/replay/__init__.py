"""Offline replay of Miles / slime debug rollout dumps (``rescue replay``).

``dumps`` reads the dumps as plain records, ``census`` reports their outcome census,
``arms`` the arms' advantages with frozen statistics, ``gradients`` their policy gradients
on a Hugging Face causal LM (``model``). numpy only at import; torch (the ``[replay]``
extra) is imported inside functions: by ``dumps`` to unpickle a dump file, and with
transformers by ``model`` and ``gradients`` to build the model and take gradients.
"""
