"""The Soft-RoCE benchmark's comparison (bench.py): a round's 8 B figures are medians over its
process pairs, perftest runs without a finite row are left out, bandwidths are compared in perftest's
unit (MiB/s), and a round whose dicomm runs did not all verify over verbs is not reported as verified."""
import json

from tests.rdma import bench


def perftest_lat(typical: str) -> str:
    # ib_write_lat's row: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    return (" #bytes #iterations    t_min[usec]\n"
            f" 8       1000          10.20          300.00       {typical}     12.00   8.0   40.0   150.0\n")


def dicomm(records: list[tuple[int, float]], verified: bool = True, transport: str = "verbs") -> str:
    return json.dumps({"records": [{"backend": "dicomm-native-verbs", "bytes": b, "lat_us_median": us,
                                    "verified": verified, "transport": transport} for b, us in records]})


def round_files(r: int, perf: list[str], native: list[float], full_ok: bool = True, stream_ok: bool = True) -> dict:
    files = {f"dicomm_{r}.rc": "0", f"dicomm_{r}.json": dicomm([(8, 20.0), (1 << 20, 26000.0)], verified=full_ok),
             f"write_bw_1m_{r}.txt": " 1048576    100           40.00              40.50              0.000039\n",
             f"dicomm_stream_{r}.json": json.dumps({"MiBps_median": 36.45, "verified": stream_ok})}
    for k, (p, n) in enumerate(zip(perf, native), start=1):
        files[f"dicomm_lat_{r}_{k}.rc"] = "0"
        files[f"write_lat_{r}_{k}.txt"] = perftest_lat(p)
        files[f"dicomm_lat_{r}_{k}.json"] = dicomm([(8, n)])
    return files


def test_a_round_compares_medians_over_its_process_pairs():
    files = round_files(1, ["10.50", "19.80", "10.70"], [15.0, 24.0, 16.0])
    (row,) = bench.compare(files)
    assert row["ib_write_lat_8B_pairs_us"] == [10.5, 19.8, 10.7]
    assert row["ib_write_lat_8B_typical_us"] == 10.7
    assert row["native_8B_pairs_median_us"] == 16.0
    assert abs(row["native_8B_pairs_ratio"] - 16.0 / 10.7) < 1e-12
    assert row["verified"]
    # the full run's figures are compared with the same perftest median
    assert abs(row["dicomm-native-verbs 8B ratio"] - 20.0 / 10.7) < 1e-12
    # 1 MiB in 26000 us is 1e6 / 26000 MiB/s, in perftest's unit (its "MB/sec" is MiB/s)
    assert abs(row["dicomm-native-verbs 1MiB MiBps"] - 1e6 / 26000.0) < 1e-9
    assert abs(row["dicomm-native-verbs 1MiB ratio"] - 1e6 / 26000.0 / 40.5) < 1e-9
    assert abs(row["native_8B_fastest_pair_ratio"] - 15.0 / 10.5) < 1e-12
    assert abs(row["native stream 1MiB ratio"] - 0.9) < 1e-12  # 36.45 / 40.5
    table = bench.table([row])
    assert "| 10.5, 19.8, 10.7 us | 10.70 us | 15.0, 24.0, 16.0 us | 16.00 us | 1.50x | 1.43x |" in table
    assert "| 40.5 MiB/s | 36.5 MiB/s | 0.90 |" in table


def test_a_perftest_run_without_a_finite_row_is_left_out_of_the_median():
    files = round_files(1, ["10.50", "inf", "11.50"], [15.0, 16.0, 17.0])
    (row,) = bench.compare(files)
    assert row["ib_write_lat_8B_pairs_us"] == [10.5, 11.5]
    assert row["ib_write_lat_8B_typical_us"] == 11.0


def test_an_unverified_or_missing_dicomm_run_fails_the_round():
    files = round_files(1, ["10.5"], [15.0])
    files["dicomm_lat_1_1.json"] = dicomm([(8, 15.0)], transport="tcp")
    assert not bench.compare(files)[0]["verified"]
    files = round_files(1, ["10.5"], [15.0])
    del files["dicomm_lat_1_1.json"]
    assert not bench.compare(files)[0]["verified"]
    assert not bench.compare(round_files(1, ["10.5"], [15.0], full_ok=False))[0]["verified"]
    assert not bench.compare(round_files(1, ["10.5"], [15.0], stream_ok=False))[0]["verified"]
    files = round_files(1, ["10.5"], [15.0])
    del files["dicomm_stream_1.json"]
    assert not bench.compare(files)[0]["verified"]
