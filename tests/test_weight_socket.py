"""Two runs on one host sync weights over two sockets (verl_gsm8k/verl_plugins/weight_socket.py):
two real Ray clusters give their first jobs the same id, which verl 0.9.1 puts in the socket's
path; the launch's plugins wrap both sides of verl's weight sync with a key per cluster."""

import json
import os
import sys

from helpers import capture

from verl_gsm8k.launch.plan import VERL_PLUGINS

PROBE = """
import json, ray, verl
from verl.workers.rollout.vllm_rollout import vllm_async_server, vllm_rollout
sides = (vllm_rollout.ServerAdapter, vllm_async_server.vLLMHttpServer)
out = {"wrapped": [c.__init__.__code__.co_filename.endswith("weight_socket.py") for c in sides],
       "jobs": [], "keys": []}
from verl_gsm8k.verl_plugins.weight_socket import cluster_job_id  # after the check: it wraps too
for _ in range(2):
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    job = ray.get_runtime_context().get_job_id()
    out["jobs"].append(job)
    out["keys"].append(cluster_job_id(job))
    ray.shutdown()
print(json.dumps(out))
"""


def test_two_ray_clusters_share_a_job_id_but_not_a_weight_socket():
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES=",".join(VERL_PLUGINS))
    out = capture([sys.executable, "-c", PROBE], 0, 120, env=env).stdout.splitlines()[-1]
    out = json.loads(out)
    assert out["jobs"][0] == out["jobs"][1], out  # verl's path alone would be the same file
    job = out["jobs"][0]
    assert out["keys"][0] != out["keys"][1] and all(key.startswith(job) for key in out["keys"])
    assert out["wrapped"] == [True, True], out
