"""Hydra takes sweepers from the `hydra_plugins` namespace only, keyed by where the class is defined: mtp-lab's grid
sweeper (lab/run/grid_sweeper.py) is defined here under that name."""

from lab.run.grid_sweeper import GridSweeper as LabGridSweeper


class GridSweeper(LabGridSweeper):
    pass
