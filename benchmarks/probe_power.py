"""Attention throughput at the power cap: each system run back to back for a few seconds
while NVML samples the board power and the SM clock, so that a kernel's sustained speed
and its energy per FLOP can be told apart from what a short timing window sees.

    python -m benchmarks.probe_power [--seconds 3] [--out probe.json]

For every shape and system, after its output is checked against the float32 reference:
a CUDA graph of `REPEATS` calls replayed for `seconds`, an event pair around the first
replays (about as long as benchmarks/attention.py's window) and one around all of them;
power and clock are the means of the samples taken while the replays ran, with the share
of samples in which NVML names each reason for holding the clock down (the power cap, a
hardware slowdown, thermal limits, the power brake). Systems take turns twice (A B C A B
C), so that heating falls on all of them alike.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

REPEATS = 3
SHAPES = "2,16,16384,128;1,16,16384,128;4,32,4096,64"  # batch,heads,seq,head_dim[,causal];...
SYSTEMS = ("weft", "cudnn", "triton")


# Why the SM clock is below its maximum (NVML's clock event reasons, a bit mask per sample).
CLOCK_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}


class Sampler:
    """NVML power (W), SM clock (MHz), temperature (C) and the reasons the clock is held
    down (CLOCK_REASONS' bits, or -1 where NVML cannot tell), sampled every `period`
    seconds on a thread while active."""

    def __init__(self, period=0.02):
        self.period, self.samples, self.active = period, [], False
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            self.read = lambda: (pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                                 pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                                 pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                                 reasons(handle) if reasons else -1)
        except ImportError:  # no NVML bindings: nvidia-smi per sample (tens of ms each)
            import subprocess

            fields = "power.draw,clocks.sm,temperature.gpu"
            query = ["nvidia-smi", f"--query-gpu={fields},clocks_event_reasons.active",
                     "--format=csv,noheader,nounits", "-i", "0"]
            if subprocess.run(query, capture_output=True).returncode:  # a driver without the field
                query[1] = f"--query-gpu={fields}"

            def read():
                values = subprocess.check_output(query, text=True).split(",")
                reasons = int(values[3], 16) if len(values) > 3 else -1
                return float(values[0]), float(values[1]), float(values[2]), reasons
            self.read = read
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            if self.active:
                self.samples.append(self.read())
            time.sleep(self.period)

    def window(self):
        self.samples, self.active = [], True

    def close(self):
        self.active = False
        rows = self.samples[len(self.samples) // 5:]  # past the ramp of the first fifth
        mean = lambda i: sum(r[i] for r in rows) / max(len(rows), 1)  # noqa: E731
        known = [r[3] for r in rows if r[3] >= 0]
        held = {name: sum(1 for r in known if r & bit) / len(known) for bit, name in CLOCK_REASONS.items()} \
            if known else None
        return {"watts": mean(0), "mhz": mean(1), "celsius": mean(2), "samples": len(rows), "clock_held_by": held}


def sustained(torch, fn, seconds, sampler) -> dict:
    """ms per call over the first replays and over `seconds` of replays, with NVML means."""
    from benchmarks.memory_bound import _capture_graph

    graph = _capture_graph([fn], REPEATS)
    graph.replay()
    torch.cuda.synchronize()
    start, early, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    sampler.window()
    start.record()
    for _ in range(5):
        graph.replay()
    early.record()
    early.synchronize()
    replays = 5
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for _ in range(4):
            graph.replay()
        replays += 4
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    power = sampler.close()
    return {"ms_first": start.elapsed_time(early) / (5 * REPEATS),
            "ms_sustained": start.elapsed_time(end) / (replays * REPEATS), **power}


def held_by(result) -> str:
    """', clock held by sw_power_cap 97%, ...' for the reasons seen in a run's samples."""
    held = result.get("clock_held_by")
    if not held:
        return ""
    seen = [f"{name} {share:.0%}" for name, share in held.items() if share > 0]
    return ", clock held by " + (", ".join(seen) if seen else "nothing")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--shapes", default=SHAPES, help="batch,heads,seq,head_dim[,causal];...")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    import torch

    from benchmarks.attention import check, find_systems, forward_flops, random_inputs, reference, save_json

    found = find_systems(torch, args.systems.split(","))
    sampler = Sampler()
    rows = []
    for shape in args.shapes.split(";"):
        batch, heads, seq, head_dim, *causal = (int(x) for x in shape.split(","))
        causal = bool(causal and causal[0])
        torch.manual_seed(0)
        q, k, v = random_inputs(torch, 3, batch, heads, seq, head_dim)
        scale = head_dim ** -0.5
        ref = reference(q, k, v, causal, scale)
        flops = forward_flops(batch, heads, seq, head_dim, causal)
        good = {}
        for name, system in found.items():
            entry = {"failure": system} if isinstance(system, str) else check(torch, system, q, k, v, causal,
                                                                             scale, ref)
            if "failure" in entry:
                rows.append({"shape": [batch, heads, seq, head_dim], "causal": causal, "system": name, **entry})
            else:
                good[name] = system
        del ref
        for turn in range(2):
            for name, system in good.items():
                result = sustained(torch, lambda fn=system: fn(q, k, v, causal, scale), args.seconds, sampler)
                result.update(shape=[batch, heads, seq, head_dim], causal=causal, system=name, turn=turn,
                              tflops_first=flops / result["ms_first"] / 1e9,
                              tflops_sustained=flops / result["ms_sustained"] / 1e9)
                result["pj_per_flop"] = result["watts"] / (result["tflops_sustained"] * 1e12) * 1e12
                rows.append(result)
                print(f"b{batch} h{heads} s{seq} d{head_dim} {'causal' if causal else 'full'} {name} turn {turn}: "
                      f"first {result['tflops_first']:6.1f} sustained {result['tflops_sustained']:6.1f} "
                      f"TFLOP/s, {result['watts']:5.0f} W, {result['mhz']:5.0f} MHz, "
                      f"{result['celsius']:3.0f} C, {result['pj_per_flop']:.3f} pJ/FLOP{held_by(result)}", flush=True)
                save_json(rows, args.out)
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
