"""The activations: their accuracy (float32 ULPs against 50-digit references, asked of the
endpoint) and their two kernels. The routes' bodies: rest/test_activations.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from bench import accuracy
from contract.readme import block
from service.activations import ACTIVATIONS, EXACT_IN_FLOAT32, IR_VERSION, OPSET, build_graph

BINARY = {"Content-Type": "application/octet-stream"}
ROOT = Path(__file__).resolve().parents[2]

# The float32 points the issue named (the tails where 1 + erf and 1 + tanh cancel, the sigmoid
# tails, ELU just below 0, GELU's and SiLU's minima, overflow), and each function's and
# derivative's value there to 20 digits, from mpmath at 50 (``"-0"``: below 1e-300 in size).
POINTS = np.array(
    [
        -3.4e38, -1e20, -90.0, -25.0, -17.0, -13.0, -10.0, -8.0, -6.0, -5.0, -3.0,
        -1.2784645557403564, -1.0, -0.7517915368080139, -1e-07, 0.0, 1e-07, 0.5, 1.0, 3.0,
        10.0, 1e20,
    ],
    np.float32,
)  # fmt: skip
EXACT = {
    "gelu": (
        (
            "-0",
            "-0",
            "-0",
            "-7.641741765956402291e-137",
            "-6.9801935435681406923e-64",
            "-7.952313719414843587e-38",
            "-7.619853024160526066e-23",
            "-4.9767684594174272988e-15",
            "-5.9195258702261888442e-9",
            "-1.4332578593959695584e-6",
            "-4.04969409489028358e-3",
            "-1.2854045379368750416e-1",
            "-1.5865525393145705141e-1",
            "-1.6997120747990363003e-1",
            "-4.9999996594881973898e-8",
            "0",
            "5.000000457372776841e-8",
            "3.4573123063700655182e-1",
            "8.4134474606854294859e-1",
            "2.9959503059051097164",
            "1.0e+1",
            "1.0000000200408773427e+20",
        ),
        (
            "-0",
            "-0",
            "-0",
            "-1.910425737398465604e-135",
            "-1.1866049666320598978e-62",
            "-1.033730444011335615e-36",
            "-7.6184000964648140857e-22",
            "-3.9796072610867959891e-14",
            "-3.5468709453902014781e-8",
            "-7.1469460017922946279e-6",
            "-1.1945647204183927e-2",
            "-1.2471388229886536458e-1",
            "-8.3315470587686298383e-2",
            "-5.2273121045751549767e-9",
            "4.999999202115429873e-1",
            "5.0e-1",
            "5.000000797884570127e-1",
            "8.6749512465616284253e-1",
            "1.0833154705876862984",
            "1.011945647204183927",
            "1.0",
            "1.0",
        ),
    ),
    "gelu_tanh": (
        (
            "-0",
            "-0",
            "-0",
            "-0",
            "-1.5845430789486135444e-163",
            "-1.0511517767632532554e-76",
            "-1.2040923482098059937e-37",
            "-3.107782937501111218e-21",
            "-8.4396467007622970837e-11",
            "-2.2917961966295060456e-7",
            "-3.6373920817730188378e-3",
            "-1.2876831263059765898e-1",
            "-1.5880800939172329522e-1",
            "-1.7004065396220762268e-1",
            "-4.9999996594881973898e-8",
            "0",
            "5.000000457372776841e-8",
            "3.4571400982514392204e-1",
            "8.4119199060827670478e-1",
            "2.9963626079182269812",
            "1.0e+1",
            "1.0000000200408773427e+20",
        ),
        (
            "-0",
            "-0",
            "-0",
            "-0",
            "-1.0046252099873513966e-161",
            "-3.9623941864616549531e-75",
            "-2.7576380638540316073e-36",
            "-4.7147845041068415845e-20",
            "-7.7099739309536955117e-10",
            "-1.5463619875325945956e-6",
            "-1.1584166630969726204e-2",
            "-1.2458270124281784749e-1",
            "-8.296408384578255514e-2",
            "2.8849257086056158298e-4",
            "4.999999202115429873e-1",
            "5.0e-1",
            "5.000000797884570127e-1",
            "8.6736990353464231156e-1",
            "1.0829640838457825551",
            "1.0115841666309697262",
            "1.0",
            "1.0",
        ),
    ),
    "gelu_sigmoid": (
        (
            "-0",
            "-0",
            "-2.6854295994120019557e-65",
            "-8.292964450406389599e-18",
            "-4.6192597269098594529e-12",
            "-3.1970074301062046467e-9",
            "-4.0579612948553099903e-7",
            "-9.76642886573037821e-6",
            "-2.2035354978739240395e-4",
            "-1.0070162673523689397e-3",
            "-1.8071309707785966513e-2",
            "-1.30315652231595737e-1",
            "-1.5420423406717870429e-1",
            "-1.6361011439410761249e-1",
            "-4.9999996329304771705e-8",
            "0",
            "5.0000004839304970603e-8",
            "3.5038843660638012317e-1",
            "8.4579576593282129571e-1",
            "2.9819286902922140335",
            "9.9999995942038705145",
            "1.0000000200408773427e+20",
        ),
        (
            "-0",
            "-0",
            "-4.5407630715390939736e-65",
            "-1.3782906916575419509e-17",
            "-7.5902588947919822018e-12",
            "-5.195382996232906276e-9",
            "-6.5008537140890178078e-7",
            "-1.5401638028495305498e-5",
            "-3.383023764770580632e-4",
            "-1.5121932401312308813e-3",
            "-2.4548323905652348743e-2",
            "-9.7257765364006429855e-2",
            "-6.7779606556334056567e-2",
            "-2.3607759116980872931e-4",
            "4.9999991489999900551e-1",
            "5.0e-1",
            "5.0000008510000099449e-1",
            "8.7922191196541427102e-1",
            "1.0677796065563340566",
            "1.0245483239056523487",
            "1.0000006500853714089",
            "1.0",
        ),
    ),
    "silu": (
        (
            "-0",
            "-0",
            "-7.3746113615914638873e-38",
            "-3.4719859661927864025e-10",
            "-7.0378938305703620216e-7",
            "-2.9384215872746467987e-5",
            "-4.5397868702434394505e-4",
            "-2.682801043731824831e-3",
            "-1.4835738939808646004e-2",
            "-3.3464254621424277797e-2",
            "-1.4227761953270034264e-1",
            "-2.7846454276107377676e-1",
            "-2.6894142136999512075e-1",
            "-2.4089735850987441088e-1",
            "-4.9999998084304812724e-8",
            "0",
            "5.0000003084304929585e-8",
            "3.1122966560092728232e-1",
            "7.3105857863000487925e-1",
            "2.8577223804672996574",
            "9.9995460213129756561",
            "1.0000000200408773427e+20",
        ),
        (
            "-0",
            "-0",
            "-7.292671235351558733e-38",
            "-3.3331065274968562002e-10",
            "-6.6238997844665197239e-7",
            "-2.7123825156985781514e-5",
            "-4.0856020865708231582e-4",
            "-2.3465512355853156561e-3",
            "-1.2326432591525512576e-2",
            "-2.6547432429665919011e-2",
            "-8.8104106015169617069e-2",
            "-2.827039668355436669e-9",
            "7.2329488128513268211e-2",
            "1.5672469655623266261e-1",
            "4.999999499999994157e-1",
            "5.0e-1",
            "5.000000500000005843e-1",
            "7.3996118730265180917e-1",
            "9.2767051187148673179e-1",
            "1.0881041060151696171",
            "1.0004085602086570823",
            "1.0",
        ),
    ),
    "relu": (
        (
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "1.0000000116860974231e-7",
            "5.0e-1",
            "1.0",
            "3.0",
            "1.0e+1",
            "1.0000000200408773427e+20",
        ),
        (
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            "1.0",
            "1.0",
            "1.0",
            "1.0",
            "1.0",
            "1.0",
        ),
    ),
    "elu": (
        (
            "-1.0",
            "-1.0",
            "-1.0",
            "-9.9999999998611205614e-1",
            "-9.9999995860062281215e-1",
            "-9.9999773967059301895e-1",
            "-9.9995460007023751515e-1",
            "-9.9966453737209748816e-1",
            "-9.9752124782333364158e-1",
            "-9.932620530009145329e-1",
            "-9.5021293163213605702e-1",
            "-7.2153546085319618999e-1",
            "-6.321205588285576784e-1",
            "-5.2847895172276682533e-1",
            "-9.9999996168609792114e-8",
            "0",
            "1.0000000116860974231e-7",
            "5.0e-1",
            "1.0",
            "3.0",
            "1.0e+1",
            "1.0000000200408773427e+20",
        ),
        (
            "0",
            "0",
            "8.1940126239905154304e-40",
            "1.3887943864964020595e-11",
            "4.1399377187851666597e-8",
            "2.2603294069810543258e-6",
            "4.5399929762484851536e-5",
            "3.3546262790251183882e-4",
            "2.478752176666358423e-3",
            "6.7379469990854670966e-3",
            "4.9787068367863942979e-2",
            "2.7846453914680381001e-1",
            "3.678794411714423216e-1",
            "4.7152104827723317467e-1",
            "9.9999990000000383139e-1",
            "1.0",
            "1",
            "1",
            "1",
            "1",
            "1",
            "1",
        ),
    ),
    "phi": (
        (
            "0",
            "0",
            "0",
            "3.0566967063825609164e-138",
            "4.1059962020989062896e-65",
            "6.1171643995498796823e-39",
            "7.619853024160526066e-24",
            "6.2209605742717841235e-16",
            "9.865876450376981407e-10",
            "2.8665157187919391167e-7",
            "1.3498980316300945267e-3",
            "1.0054283727815196766e-1",
            "1.5865525393145705141e-1",
            "2.260882161583968739e-1",
            "4.9999996010577149365e-1",
            "5.0e-1",
            "5.0000003989422850635e-1",
            "6.9146246127401310364e-1",
            "8.4134474606854294859e-1",
            "9.9865010196836990547e-1",
            "1.0",
            "1.0",
        ),
        (
            "0",
            "0",
            "0",
            "7.6539297364193926596e-137",
            "7.0041821343185812004e-64",
            "7.9988277570068114977e-38",
            "7.6945986267064193463e-23",
            "5.052271083536892288e-15",
            "6.075882849823285487e-9",
            "1.4867195147342977079e-6",
            "4.4318484119380071756e-3",
            "1.7619316747234465571e-1",
            "2.419707245191433498e-1",
            "3.0073259715804096918e-1",
            "3.9894228040143068323e-1",
            "3.9894228040143267794e-1",
            "3.9894228040143068323e-1",
            "3.5206532676429947777e-1",
            "2.419707245191433498e-1",
            "4.4318484119380071756e-3",
            "7.6945986267064193463e-23",
            "0",
        ),
    ),
}


def _post_binary(client, name: str, x: np.ndarray, **params: str):
    response = client.post(
        f"/v1/activations/{name}", params=params, content=x.tobytes(), headers=BINARY
    )
    assert response.status_code == 200, response.text
    return response, np.frombuffer(response.content, "<f4")


def test_the_carried_references_are_mpmath_s() -> None:
    for name, (forward, derivative) in EXACT.items():
        for is_derivative, values in ((False, forward), (True, derivative)):
            want = accuracy.exact(name, is_derivative, POINTS)
            np.testing.assert_allclose(np.array(values, float), want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("derivative", [False, True])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_reference_points_within_the_stated_ulps(client, name: str, derivative: bool) -> None:
    response, got = _post_binary(client, name, POINTS, derivative=str(derivative).lower())
    assert response.headers["X-Kernel"] == "accurate"
    want = np.array(EXACT[name][derivative], float)
    error = accuracy.ulp_error(got, want)
    bound = accuracy.BOUNDS[name, derivative]
    worst = int(np.nanargmax(error)) if np.isfinite(error).any() else 0
    assert np.nanmax(error, initial=0) <= bound, f"x={POINTS[worst]}: {got[worst]} vs {want[worst]}"
    assert not accuracy.edge_failures(got, want, POINTS)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "onnxruntime"])
def test_every_region_within_the_stated_ulps(compiled: bool) -> None:
    """The same measurement as ``make accuracy``, on fewer points: every function, derivative
    and region of the float32 line, against mpmath, within the README's bounds, for the
    accurate kernel compiled and as graphs on onnxruntime."""
    evaluator = accuracy.evaluator(compile=compiled)
    assert (evaluator.compiled is not None) == compiled
    table = accuracy.measure(evaluator.evaluate, n=150, kernels_to_measure=("accurate",))
    over = {
        (name, derivative, region): worst
        for (name, derivative, _), row in table.items()
        for region, worst in row.items()
        if worst > accuracy.BOUNDS[name, derivative]
    }
    assert not over


@pytest.mark.parametrize("derivative", [False, True])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_limits_and_nan(client, name: str, derivative: bool) -> None:
    x = accuracy.EDGE_POINTS
    _, got = _post_binary(client, name, x, derivative=str(derivative).lower())
    assert not accuracy.edge_failures(got, accuracy.exact(name, derivative, x), x)


@pytest.mark.parametrize(
    ("name", "nodes"),
    [
        ("gelu", [helper.make_node("Gelu", ["x"], ["y"], approximate="none")]),
        ("gelu_tanh", [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")]),
        ("elu", [helper.make_node("Elu", ["x"], ["y"], alpha=1.0)]),
        ("relu", [helper.make_node("Relu", ["x"], ["y"])]),
        (
            "silu",
            [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        ),
    ],
)
def test_native_kernel_is_the_exported_op(client, name: str, nodes: list) -> None:
    """kernel=native answers exactly what onnxruntime's op answers in a model, tails and all."""
    tensor = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [tensor("x", TensorProto.FLOAT, None)], [tensor("y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.concatenate([POINTS, np.linspace(-12, 12, 2001, dtype=np.float32)])
    response, got = _post_binary(client, name, x, kernel="native")
    assert response.headers["X-Kernel"] == "native"
    np.testing.assert_array_equal(got, session.run(None, {"x": x})[0])
    body = client.post(f"/v1/activations/{name}", json={"data": [-8.0], "kernel": "native"})
    assert body.json()["kernel"] == "native"
    assert np.float32(body.json()["data"][0]) == session.run(None, {"x": x[7:8]})[0][0]


def test_the_kernels_differ_where_the_native_op_cancels(client) -> None:
    _, accurate = _post_binary(client, "gelu", np.array([-8.0], np.float32))
    _, native = _post_binary(client, "gelu", np.array([-8.0], np.float32), kernel="native")
    assert accurate[0] == np.float32(-4.9767684594174272988e-15) and native[0] != accurate[0]


def test_every_contract_activation_is_defined_once() -> None:
    from contract.names import EVALUATED_ACTIVATIONS
    from service.activations import _DEFINED, ACTIVATIONS

    assert list(ACTIVATIONS) == list(EVALUATED_ACTIVATIONS)
    assert set(_DEFINED) == set(EVALUATED_ACTIVATIONS)


def test_readme_accuracy_table_is_the_committed_report() -> None:
    """The README's table is what ``make accuracy`` wrote into docs/accuracy.json."""
    summary = json.loads((ROOT / "docs" / "accuracy.json").read_text())
    readme = (ROOT / "docs" / "endpoints.md").read_text()
    assert block(readme, accuracy.README_BLOCK) == accuracy.readme_block(summary)
    assert summary["worst_accurate"] <= 1.0


@pytest.mark.slow
def test_the_shipped_fits_are_bench_fits() -> None:
    """The coefficients in service/activations.py are what ``python -m bench.fits`` derives."""
    from bench import fits
    from service import activations

    derived = fits.derive()
    assert derived["GELU_ROOT"] == activations.GELU_ROOT
    # The fit solves an ill-conditioned least-squares system; LAPACK's kernels differ by CPU,
    # and the same derivation gave coefficients 2.2e-10 apart (relative) on an AVX2 machine
    # and an AVX-512 one. Both fits are equally good; 1e-8 still catches a changed fit.
    for name in ("MILLS_P", "MILLS_Q", "ROOT_QUOTIENT_P", "ROOT_QUOTIENT_Q"):
        np.testing.assert_allclose(
            getattr(activations, name), np.asarray(derived[name], float), rtol=1e-8
        )


def test_the_graphs_keep_a_zeros_sign_where_exp_underflows() -> None:
    """Far out e^-|v| is below float64's range: with exp's argument held (``Formula.exp``) as
    the compiled loop holds it, the graphs give the compiled kernel's bits, a negative zero
    left of 0 (before, +0 below -745 for silu: docs/accuracy-exhaustive.md)."""
    x = np.append(-np.geomspace(30.0, 3e38, 200), [-np.inf, np.inf]).astype(np.float32)
    graphs, compiled = accuracy.evaluator(compile=False), accuracy.evaluator(compile=True)
    for name in ACTIVATIONS:
        for derivative in (False, True):
            got = graphs.evaluate(name, x, derivative)
            want = compiled.evaluate(name, x, derivative)
            assert got.tobytes() == want.tobytes(), (name, derivative)


def test_float32_graphs_only_select_and_compare() -> None:
    """A graph left in float32 is exact only if it rounds nothing and its NaN rules are IEEE's,
    on every provider: on CUDA float32 Exp was 1.82 ULP off (elu') and Sign gave 0 for NaN
    (relu'), both within bounds on the CPU (runs/gpu-2026-11-28-b)."""
    exact = {"Relu", "Greater", "Where", "IsNaN", "Identity"}
    for name, derivative in EXACT_IN_FLOAT32:
        graph = build_graph(ACTIVATIONS[name], derivative).graph
        assert graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
        assert {node.op_type for node in graph.node} <= exact, (name, derivative)
    x = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 1e-45, np.inf], np.float32)
    relu_derivative = accuracy.evaluator(compile=False).evaluate("relu", x, True)
    np.testing.assert_array_equal(relu_derivative, [np.nan, 0, 0, 0, 0, 1, 1])
    assert not np.signbit(relu_derivative[1:5]).any()
