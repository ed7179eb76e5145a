"""Test-wide settings: one torch thread, so runs are steady on a shared 2-core machine (CI runs
one pytest process; torch's default of one thread per core slows everything down as soon as
another process holds a core)."""

import torch

torch.set_num_threads(1)
