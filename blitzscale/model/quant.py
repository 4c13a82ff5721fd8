"""Weight quantization as the plain parts of the system see it (no torch).

A model's `ModelConfig.quant` says how its linear layers (q/k/v, o, gate/up, down) are
stored; the embedding, the norms and lm_head always stay in the activation dtype.

- "none": every weight in the activation dtype (bf16 on a GPU, fp32 on CPU).
- "fp8": e4m3 (torch.float8_e4m3fn) weights with one fp32 scale per output channel
  (w = q * scale[row]), activations quantized per token at run time (dynamic). This is
  the scheme of the public compressed-tensors FP8 checkpoints (e.g. the
  Llama-3.1-8B-Instruct-FP8 ones): `weights: {num_bits: 8, type: float, strategy:
  channel}`, `input_activations: {dynamic: true, strategy: token}`.

`quant_from_hf` reads a config.json's `quantization_config` and refuses, by name, every
scheme this server does not run (another method, group/block/tensor strategies, int8/int4,
static activation scales, an fp8 KV cache...).
"""

from __future__ import annotations

from typing import Any

from blitzscale.errors import CheckpointError

QUANTS = ("none", "fp8")
FP8_DTYPE = "float8_e4m3fn"  # the stored weights' dtype (torch's name)
SCALE_DTYPE = "float32"  # the per-channel scales' dtype in our layout
FP8_MAX = 448.0  # the largest finite e4m3fn value
# The smallest per-token scale: a row of zeros (a padded row of a CUDA graph) quantizes to
# zeros instead of dividing by zero.
MIN_SCALE = 1e-12
DTYPE_BYTES = {FP8_DTYPE: 1, SCALE_DTYPE: 4}
LINEAR_NAMES = ("qkv", "o", "gate_up", "down")  # the quantized tensors of a layer


def scale_name(linear: str) -> str:
    """The layout name of a quantized linear's scales: "qkv" -> "qkv_scale"."""
    return f"{linear}_scale"


def check_quant(quant: str) -> str:
    if quant not in QUANTS:
        raise CheckpointError(f"unknown weight quantization {quant!r}; supported: {', '.join(QUANTS)}")
    return quant


_FORMATS = ("float-quantized", "naive-quantized")
_IGNORABLE = ("lm_head",)  # layers we never quantize anyway


def quant_from_hf(qc: Any) -> str:
    """The `quant` of a config.json's `quantization_config` (None or absent: "none")."""
    if qc is None:
        return "none"
    if not isinstance(qc, dict):
        raise CheckpointError(f"config.json quantization_config is not an object: {qc!r}")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise CheckpointError(
            f"unsupported quantization: quant_method {method!r}; this server loads "
            "compressed-tensors FP8 checkpoints (per-channel e4m3 weights, dynamic per-token "
            "activations) only"
        )
    fmt = qc.get("format")
    if fmt is not None and fmt not in _FORMATS:
        raise CheckpointError(
            f"unsupported compressed-tensors format {fmt!r}; supported: {', '.join(_FORMATS)}"
        )
    if qc.get("kv_cache_scheme") is not None:
        raise CheckpointError(
            f"unsupported quantization: kv_cache_scheme {qc['kv_cache_scheme']!r} (the KV cache "
            "stays in the activation dtype here)"
        )
    ignore = [i for i in qc.get("ignore") or [] if i not in _IGNORABLE]
    if ignore:
        raise CheckpointError(
            f"unsupported quantization: layers left unquantized {ignore!r} (only lm_head may be)"
        )
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"compressed-tensors config has no config_groups: {groups!r}")
    for name, group in groups.items():
        _check_group(str(name), group)
    return "fp8"


def _check_group(name: str, group: Any) -> None:
    if not isinstance(group, dict):
        raise CheckpointError(f"quantization config group {name!r} is not an object: {group!r}")
    targets = group.get("targets")
    if targets != ["Linear"]:
        raise CheckpointError(f"quantization config group {name!r}: unsupported targets {targets!r}")
    w = group.get("weights")
    want_w = {"num_bits": 8, "type": "float", "strategy": "channel"}
    _check_args(name, "weights", w, want_w)
    if w.get("dynamic"):
        raise CheckpointError(f"quantization config group {name!r}: dynamic weight scales are not supported")
    if w.get("symmetric") is False:
        raise CheckpointError(f"quantization config group {name!r}: asymmetric weights are not supported")
    a = group.get("input_activations")
    if a is None:
        raise CheckpointError(
            f"quantization config group {name!r}: weight-only FP8 (no input_activations) is not "
            "supported; this server quantizes activations per token (dynamic)"
        )
    _check_args(name, "input_activations", a, {"num_bits": 8, "type": "float", "strategy": "token"})
    if a.get("dynamic") is not True:
        raise CheckpointError(
            f"quantization config group {name!r}: static input activation scales "
            f"(dynamic={a.get('dynamic')!r}) are not supported; only dynamic per-token"
        )
    if group.get("output_activations") is not None:
        raise CheckpointError(
            f"quantization config group {name!r}: output activation quantization is not supported"
        )


def _check_args(group: str, part: str, args: Any, want: dict[str, Any]) -> None:
    if not isinstance(args, dict):
        raise CheckpointError(f"quantization config group {group!r}: {part} is not an object: {args!r}")
    for key, value in want.items():
        if args.get(key) != value:
            raise CheckpointError(
                f"unsupported quantization: group {group!r} {part} {key}={args.get(key)!r} "
                f"(supported: {key}={value!r}; this server runs per-channel FP8 e4m3 weights with "
                "dynamic per-token FP8 activations)"
            )
    for key in ("group_size", "block_structure"):
        if args.get(key) is not None:
            raise CheckpointError(
                f"unsupported quantization: group {group!r} {part} {key}={args[key]!r} (per-channel only)"
            )


def hf_quantization_config() -> dict[str, Any]:
    """The compressed-tensors `quantization_config` of our "fp8" (for writing HF folders)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "channel",
                    "symmetric": True,
                    "dynamic": False,
                    "group_size": None,
                    "block_structure": None,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "token",
                    "symmetric": True,
                    "dynamic": True,
                    "group_size": None,
                    "block_structure": None,
                },
                "output_activations": None,
            }
        },
    }
