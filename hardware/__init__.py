"""Deploy: the policy bundle (ONNX + layout), its runtimes (onnxruntime, the generated C), C code
generation, and the hardware abstraction layer (robot contract, control loop, safety, drivers)."""

from embodied.hardware.bundle import PolicyRunner, export_run, load_bundle, read_bundle

__all__ = ["PolicyRunner", "export_run", "load_bundle", "read_bundle"]
