"""Pure helpers of the node agent (the agent itself runs in tests/integration)."""

from __future__ import annotations

from provision.validate import agent


def test_cpulist_expands_ranges():
    assert agent._cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_isa_prefers_widest_vector_unit():
    assert agent._isa({"avx512f", "avx2", "fma", "sse2"})["fp32_flops_per_cycle"] == 64
    assert agent._isa({"avx2", "fma", "avx", "sse2"})["best"] == "avx2+fma"
    assert agent._isa({"avx2", "avx", "sse2"})["best"] == "avx"  # AVX2 without FMA
    assert agent._isa(set())["best"] == "scalar"


def test_cpu_peak_counts_physical_cores_only():
    cpu = {"cores": 8, "threads": 16, "ghz": 2.0, "isa": {"fp32_flops_per_cycle": 32}}
    assert agent._cpu_peak_gflops(cpu) == 8 * 2.0 * 32


def test_stream_arrays_are_four_times_the_llc_and_bounded_by_ram():
    assert agent._stream_elements(256 << 20, None) == 4 * (256 << 20) // 8
    assert agent._stream_elements(1 << 20, None) == 16 << 20  # floor of 16M doubles
    assert agent._stream_elements(256 << 20, 8 << 30) == (8 << 30) // 8 // 24


def test_fio_jobfile_runs_three_bounded_jobs_on_a_file():
    text = agent.fio_jobfile("/data/.x/fio.dat", "512M", 3, direct=True)
    assert "filename=/data/.x/fio.dat" in text and "direct=1" in text
    assert "runtime=3" in text and "time_based=1" in text
    assert [line for line in text.splitlines() if line.startswith("[")] == [
        "[global]",
        "[seq_write]",
        "[seq_read]",
        "[rand_read]",
    ]
    assert text.count("stonewall") == 3
    assert "rw=randread\nbs=4k" in text


def test_throttle_bits_name_only_real_slowdowns():
    assert agent._throttle_names(0x1 | 0x2 | 0x40) == ["hw_thermal_slowdown"]  # idle, app clocks
    assert agent._throttle_names(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake_slowdown"]


def test_pci_numa_reads_nothing_for_unknown_bus():
    assert agent._pci_numa("00000000:FF:1F.7") is None
