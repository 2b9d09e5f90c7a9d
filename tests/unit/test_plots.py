"""Figure set (mechopd.plots): every figure from a synthetic run directory written by the REAL writers of each artifact
(removability.summarize, similarity.CosineAccumulator + write_rows, gradients.aggregate + write_gradients,
deltas.parameter_deltas + write_table on tiny safetensors checkpoints, teachability.summarize), so that a format change
in a writer breaks these tests. Drawn values are compared with the artifacts (or, for deltas, with norms computed
directly from the weights); files are checked to be real PNG / PDF and byte-identical when redrawn."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection, QuadMesh
from matplotlib.container import BarContainer, ErrorbarContainer
from PIL import Image
from safetensors.torch import save_file

from mechopd.errors import DataError
from mechopd.plots import draw_all, figure_index, plots_for_tests  # noqa: F401  (replaced below)
