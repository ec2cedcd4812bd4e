"""Which ranks take part in what: the parallel context (distributed.py), FSDP (sharding.py), and stopping
on a signal or a stuck collective (signals.py)."""
