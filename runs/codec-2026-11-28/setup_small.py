import sys

sys.path.insert(0, ".")
import array
from pathlib import Path

import numpy as np
import orjson

from bench.measure import requests_for
from contract.model_config import load_model_config
from service import codecs
from service.runtime import Model

cfg = load_model_config(Path("model_repository/digits-mlp/config.pbtxt").read_bytes())
model = Model.__new__(Model)
model.name, model.version, model.config = "digits-mlp", "1", cfg
model.__post_init__()
x = (np.arange(64, dtype=np.float32) / 16).reshape(1, 64)
reqs = requests_for("digits-mlp", x)
v1, v2 = reqs["v1"].body, reqs["v2-json"].body
r1, r2 = codecs.decode_v1(v1), codecs.decode_v2(v2, None)
data = orjson.loads(v2)["inputs"][0]["data"]

flat = data
rows = orjson.loads(v1)["instances"]
a64 = np.asarray(data)
af = array.array("f", data)
fl = float
