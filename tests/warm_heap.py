"""The fork server's last preload (tests/warm_runs.py): everything the preloads made moves to the garbage
collector's permanent generation (gc.freeze, made for servers that fork), so that a forked run's
collections walk only what the run itself made. Without it each run's final gc.collect walked the whole of
torch and transformers (0.3 s a run on a 2-core EPYC Zen 3) and, writing each object's gc header, copied
every page of the server's heap into the run. A fresh interpreter never holds the server's objects at all."""
import gc

gc.freeze()
