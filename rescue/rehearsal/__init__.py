"""The CPU rehearsal of a SWE arm: stand-ins for what a CPU cannot run, framework-free.

- ``docker``: a stand-in ``docker`` executable (containers are folder copies).
- ``tasks``: tiny SWE-smith-shaped task repositories for it.

Nothing here imports Miles, slime or torch; ``rescue.miles.rehearsal`` drives Miles.
"""
