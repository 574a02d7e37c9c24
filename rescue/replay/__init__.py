"""Offline replay of Miles / slime debug rollout dumps (``rescue replay``).

``dumps`` reads the dumps as plain records (torch only to unpickle, imported lazily),
``census`` reports their outcome census, ``arms`` the arms' advantages with frozen
statistics, ``gradients`` their policy gradients on a Hugging Face causal LM (the
``[replay]`` extra). Only ``gradients`` imports torch and transformers, inside functions.
"""
