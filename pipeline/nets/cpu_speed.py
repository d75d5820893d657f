"""Faster CPU inference for the neural stages, without changing what they compute.

`cpu_runner(module, example, runtime)` turns an eval-mode torch module into a callable
with the same inputs and outputs (torch tensors in, a tensor or a list of tensors out),
run by one of RUNTIMES:

- `eager`: the module as it is (float32, contiguous): today's path;
- `channels_last`: the module and its image inputs in channels-last memory format;
- `bf16`: channels-last under `torch.autocast("cpu", bfloat16)` (fast only on CPUs with
  AVX512-BF16/AMX; emulated, so slow, elsewhere);
- `compile`: `torch.compile` of the module;
- `onnxruntime`: the module exported to ONNX and run by ONNX Runtime, float32;
- `openvino`: the module converted by OpenVINO and compiled for its CPU plugin, float32
  (`INFERENCE_PRECISION_HINT=f32`: OpenVINO would otherwise pick bf16 on CPUs that have it).

`bench/bench_cpu_speed.py` measures all of them side by side on random-init weights of the
real architectures and checks each against the float32 reference (latents within 2e-2
relative error, decoded crops within 2/255 mean absolute error). CHOSEN records the winner
per network on the machines measured; `fast_cpu_runner` applies it and falls back to
`eager` when the runtime's package is missing or the module is not on the CPU. OpenVINO's
converted models and ONNX exports are kept on disk ($HOTPLATE_CPU_CACHE, else
~/.cache/hotplate/cpu), keyed by a digest of the weights, so only the first load of a
model pays for the conversion.
HOTPLATE_CPU_RUNTIME=<runtime> overrides CHOSEN for every network (`eager` = today's path). Every
choice in CHOSEN is a float32 one, so stage keys do not change: the numbers stay within
float32 rounding of the reference. A runtime in LOW_PRECISION (bf16) computes other
numbers, so `key_precision` names it and the stages it runs in carry it in their keys:
bf16 latents never land under float32 keys.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

RUNTIMES = ("eager", "channels_last", "bf16", "compile", "onnxruntime", "openvino")

# The winner per network, from bench/bench_cpu_speed.py (see README's benchmark table).
CHOSEN: dict[str, str] = {
    "vae_encoder": "onnxruntime",
    "vae_decoder": "openvino",
    "unet": "openvino",
    "s3fd": "onnxruntime",
    "bisenet": "onnxruntime",
}
RUNTIME_ENV = "HOTPLATE_CPU_RUNTIME"  # one runtime for every net (e.g. eager, to compare)
LOW_PRECISION = ("bf16",)  # runtimes whose numbers differ beyond float32 rounding
_PACKAGE = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


@contextlib.contextmanager
def bf16_autocast(enabled: bool = True) -> Iterator[None]:
    """bfloat16 autocast on the CPU (a no-op when disabled)."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        yield


def runtime_available(runtime: str) -> bool:
    """Whether `runtime` can run here (its package is importable)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown CPU runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    pkg = _PACKAGE.get(runtime)
    from pipeline.nets.backends import package_present  # thread-safe (see there)

    return pkg is None or package_present(pkg)


def runtime_for(net: str) -> str:
    """The runtime `net` asks for: HOTPLATE_CPU_RUNTIME, else CHOSEN's, else eager."""
    return os.environ.get(RUNTIME_ENV) or CHOSEN.get(net, "eager")


def key_precision(net: str) -> str | None:
    """What a stage key must record of `net`'s runtime: its name when it computes at a
    lower precision than float32 (bf16), else None (the key stays as it always was)."""
    runtime = runtime_for(net)
    return runtime if runtime in LOW_PRECISION else None


def fast_cpu_runner(module: Any, example: Sequence[Any], net: str) -> Callable[..., Any]:
    """`cpu_runner` with the runtime CHOSEN for `net`, or eager where that cannot run."""
    runtime = runtime_for(net)
    on_cpu = all(p.device.type == "cpu" for p in module.parameters())
    if not on_cpu or not runtime_available(runtime):
        runtime = "eager"
    return cpu_runner(module, example, runtime)


def cached_runner(
    owner: Any, net: str, build: Callable[[], Any], example: Sequence[Any]
) -> Callable[..., Any]:
    """`fast_cpu_runner(build(), example, net)`, made once per `owner` (a loaded model) and
    kept on it, so that a model and its runner live and die together."""
    runners = owner.__dict__.setdefault("_hotplate_runners", {})
    if net not in runners:
        runners[net] = fast_cpu_runner(build(), example, net)
    return runners[net]


def unet_module(unet: Any) -> Any:
    """torch module: (latents, timestep, context) -> a diffusers UNet's `.sample`."""
    import torch

    class Sample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, lat: torch.Tensor, t: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
            return self.unet(lat, t, encoder_hidden_states=ctx).sample

    return Sample().eval()


def cpu_runner(module: Any, example: Sequence[Any], runtime: str) -> Callable[..., Any]:
    """A callable running `module` with `runtime`; `example` are inputs of the right
    dtypes and ranks (a 4-D float input is an image; a leading dimension is the batch)."""
    import torch

    if not runtime_available(runtime):
        raise ValueError(f"CPU runtime {runtime} needs the {_PACKAGE[runtime]} package")
    module = module.eval()
    if runtime == "eager":
        return _no_grad(module)
    if runtime == "compile":
        return _no_grad(torch.compile(module))
    if runtime in ("channels_last", "bf16"):
        module = module.to(memory_format=torch.channels_last)
        return _no_grad(module, channels_last=True, bf16=runtime == "bf16")
    if runtime == "onnxruntime":
        return _OnnxRunner(module, example)
    return _OpenVinoRunner(module, example)


def _no_grad(module: Any, channels_last: bool = False, bf16: bool = False) -> Callable[..., Any]:
    import torch

    def run(*inputs: Any) -> Any:
        if channels_last:
            inputs = tuple(
                x.contiguous(memory_format=torch.channels_last) if _is_image(x) else x
                for x in inputs
            )
        with torch.inference_mode(), bf16_autocast(bf16):
            out = module(*inputs)
        return _float(out) if bf16 else out

    return run


def _is_image(x: Any) -> bool:
    return getattr(x, "ndim", 0) == 4 and x.is_floating_point()


def _float(out: Any) -> Any:
    if isinstance(out, list | tuple):
        return [o.float() for o in out]
    return out.float()


class _OnnxRunner:
    """ONNX Runtime session of the module, exported once with a dynamic batch dimension."""

    def __init__(self, module: Any, example: Sequence[Any]) -> None:
        import onnxruntime as ort
        import torch

        example = _plain(example)
        names = [f"in{i}" for i in range(len(example))]
        with torch.no_grad():
            first = module(*example)
        outs = [f"out{i}" for i in range(len(_outputs(first)))]
        # exported once per weights (like OpenVINO's conversions): kept in the cache dir
        # a folder per model: an export over 2 GB writes its weights as files beside it
        folder = cache_dir() / f"{_digest(module, example, 'onnx')}.onnx"
        path = folder / "model.onnx"
        if not path.is_file():
            work = folder.with_name(f"{folder.name}.{os.getpid()}.part")
            work.mkdir(parents=True, exist_ok=True)
            axes = {n: _dynamic(x) for n, x in zip(names, example, strict=True) if x.ndim > 1}
            axes.update({n: _dynamic(o) for n, o in zip(outs, _outputs(first), strict=True)})
            with torch.no_grad():
                torch.onnx.export(
                    module,
                    tuple(example),
                    str(work / "model.onnx"),
                    input_names=names,
                    output_names=outs,
                    dynamic_axes=axes,
                    opset_version=17,
                    dynamo=False,
                )
            try:
                work.replace(folder)
            except OSError:  # another process put the same export there first
                shutil.rmtree(work, ignore_errors=True)
        self._session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self._names, self._many = names, isinstance(first, list | tuple)

    def __call__(self, *inputs: Any) -> Any:
        import torch

        feed = {n: x.detach().cpu().numpy() for n, x in zip(self._names, inputs, strict=True)}
        out = [torch.from_numpy(o) for o in self._session.run(None, feed)]
        return out if self._many else out[0]


class _OpenVinoRunner:
    """OpenVINO model of the module, compiled for the CPU in float32 once per input size."""

    def __init__(self, module: Any, example: Sequence[Any]) -> None:
        import openvino as ov
        import torch

        example = _plain(example)
        with torch.no_grad():
            self._many = isinstance(module(*example), list | tuple)
        self._core = ov.Core()
        # Converting a big network takes minutes on a busy CPU: keep the converted model
        # on disk under a digest of the module's code path, weights and input ranks.
        # A folder per model, renamed into place whole: two processes converting the same
        # model at once (pytest-xdist, two workers) could otherwise pair one's .xml with
        # the other's .bin
        folder = cache_dir() / f"{_digest(module, example, ov.__version__)}.openvino"
        path = folder / "model.xml"
        if path.is_file():
            self._model = self._core.read_model(str(path))
        else:
            with torch.no_grad():
                self._model = ov.convert_model(module, example_input=example)
            work = folder.with_name(f"{folder.name}.{os.getpid()}.part")
            work.mkdir(parents=True, exist_ok=True)
            ov.save_model(self._model, str(work / "model.xml"), compress_to_fp16=False)
            try:
                work.replace(folder)
            except OSError:  # another process put the same conversion there first
                shutil.rmtree(work, ignore_errors=True)
        self._compiled: dict[tuple[tuple[int, ...], ...], Any] = {}

    def _for(self, shapes: tuple[tuple[int, ...], ...]) -> Any:
        # the batch stays dynamic (a last, shorter batch must not recompile); the rest is
        # static, which is what makes OpenVINO's CPU kernels fast
        key = tuple(s[1:] if len(s) > 1 else s for s in shapes)
        if key not in self._compiled:
            model = self._model.clone()
            model.reshape(
                {i: [-1, *s[1:]] if len(s) > 1 else list(s) for i, s in enumerate(shapes)}
            )
            self._compiled[key] = self._core.compile_model(
                model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
            )
        return self._compiled[key]

    def __call__(self, *inputs: Any) -> Any:
        import torch

        arrays = [x.detach().cpu().numpy() for x in inputs]
        compiled = self._for(tuple(a.shape for a in arrays))
        result = compiled(arrays)
        out = [torch.from_numpy(result[o].copy()) for o in compiled.outputs]
        return out if self._many else out[0]


def _outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, list | tuple) else [out]


def _plain(example: Sequence[Any]) -> tuple[Any, ...]:
    """Copies of the example inputs usable for tracing (not inference-mode tensors)."""
    import torch

    with torch.inference_mode(False):
        return tuple(x.clone() for x in example)


def _dynamic(x: Any) -> dict[int, str]:
    """ONNX dynamic axes: the batch, and the height and width of images."""
    return {0: "batch", 2: "h", 3: "w"} if x.ndim == 4 else {0: "batch"}


CACHE_ENV = "HOTPLATE_CPU_CACHE"


def cache_dir() -> Path:
    """Where converted models are kept: $HOTPLATE_CPU_CACHE, else ~/.cache/hotplate/cpu
    (a test that gives a process a HOME of its own passes this on, so that the process
    does not convert again what this machine has converted)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hotplate" / "cpu"


def _digest(module: Any, example: Sequence[Any], version: str) -> str:
    """xxh3 of the module's classes, its weights' bytes and the inputs' dtypes and ranks."""
    import xxhash

    h = xxhash.xxh3_128()
    h.update(f"{version}|{module!r}".encode())
    for x in example:
        h.update(f"{x.dtype}|{x.ndim}".encode())
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()
