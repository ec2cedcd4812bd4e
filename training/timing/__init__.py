"""How long a run is and what happens when: the learning rate of each step and what is due after
it (schedule.py), and the steps a time budget leaves room for (budget.py)."""
