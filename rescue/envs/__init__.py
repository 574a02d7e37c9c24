"""Framework-free text-game environments: the plan's agentic budget-regime games.

``rescue.envs.episode``  one episode as the policy sees it (the public ALFWorld recipe's
                         prompt, history and action format), the cap, the outcome;
``rescue.envs.games``    ALFWorld and TextWorld cooking games through their own packages;
``rescue.envs.prepare``  the games of a run (tw-make's cooking games from a seed, ALFWorld's
                         downloaded games) and the prompt rows Miles reads.

Invariant: nothing here imports a training framework; TextWorld and ALFWorld are imported
only where a game is opened or made (the ``[agent]`` extra). Their Miles generate function
is ``rescue.miles.textgame``.
"""
