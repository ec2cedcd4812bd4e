"""Hardware switches applied from outside the model, shared by training and inference: which device,
and which precision (the dtype policy of training and of sampling, side by side). Nothing runs at
import time."""
