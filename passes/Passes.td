//===- Passes.td - stablehlo-amp pass declarations ------------------------===//

#ifndef STABLEHLO_AMP_PASSES_TD
#define STABLEHLO_AMP_PASSES_TD

include "mlir/Pass/PassBase.td"

def AmpInsertConvertsPass : Pass<"amp-insert-converts", "::mlir::ModuleOp"> {
  let summary = "Paints every float value of a StableHLO module with a precision "
                "and inserts converts where precision changes.";
  let description = [{
    Decides, for the whole module, which operations compute in the policy's
    compute dtype and which stay in f32, then converts values only where they
    cross from one precision to the other, each value at most once per target
    type. A painting analysis (PrecisionAnalysis) decides; this pass applies
    its decisions.

    Levels: `O0` changes nothing, `O1` lowers only the allow ops, `O2`
    paints, `O3` puts every float op in the compute dtype. The default is
    the target's: `O1` on cpu (XLA:CPU computes bf16/f16 elementwise
    arithmetic in f32 and would only add converts), `O2` on gpu and tpu.

    Operation classes (after TF grappler's auto_mixed_precision and PyTorch
    autocast):
    - *allow*: `dot_general`, `convolution`: compute-dtype operands, f32
      accumulation (the result stays f32 unless `dot-result=compute`);
    - *deny*: `exponential`, `log`, `log_plus_one`, `exponential_minus_one`,
      `power`, `rsqrt`, `sqrt`, sum and product reductions (`reduce`,
      `reduce_window`, `scatter` with an add or multiply body), batch norm,
      linear algebra: always f32, and at level O2 the elementwise ops that
      consume their results stay f32 too (softmax, norm statistics);
    - *infer*: elementwise arithmetic: low precision when its inputs are, and
      at level O2 when it lies between two allow operations;
    - *clear*: data movement, compare, select, max/min reductions: follows its
      neighbours, never forces a convert;
    - everything else (custom calls, unknown ops, sort, rng, integer, boolean
      and complex values) keeps its exact types.

    What feeds a discrete decision or linear algebra is computed in f32 back
    through its producers (dots, elementwise chains, converts; through
    private function calls, composites' decompositions, loops and
    conditionals), up to the program's inputs: rounding error is small, but
    what depends on it is not. Decisions: sort keys, `chlo.top_k` (also as
    jax.export's composite) and the ApproxTopK/TopK/PartialReduce custom
    calls, argmax/argmin (a variadic reduction whose body compares), a
    compare whose result picks integers, an index, a branch or a loop's end,
    and a float-to-integer convert. Linear algebra: `cholesky`,
    `triangular_solve` and the LAPACK, cuSOLVER, hipSOLVER and cuBLAS custom
    calls jaxlib emits.

    f32 arguments of public functions take the param dtype (except those
    marked with the argument attribute `amp.keep_dtype`, which the pass
    removes) and their f32 results the output dtype (a result marked
    `amp.state_of = N` takes argument N's dtype instead). Only f32 values
    are rewritten: f64, f16 or bf16 values in the input keep their dtype.
    Control flow (`while`, `if`, `case`) keeps its interface types and is
    painted inside; reduction bodies follow their operation. Float
    constants are re-encoded, not converted.

    *Rules follow calls.* JAX lowers library functions (`jnp.var`,
    `jnp.std`, `jax.nn.relu`, `jnp.linalg` helpers) and nested `jit`s to
    private functions. Before deciding, the pass specialises every call of a
    private, single-block function with f32 values to its call site: the
    callee's body replaces the call, one copy per call site, and callees
    left unused are erased. Every rule (storage,
    decisions and linear algebra, FP8 eligibility, calibration groups) then
    sees a called function exactly as if it were written inline, and a
    function called from two contexts is decided in each. XLA inlines every
    call before it optimises (CallInliner), so the compiled program is the
    same. Calls that carry attributes of their own (Shardy's manual
    computation bodies, frontend attributes), callees with argument or
    result attributes, public and recursive callees and functions without
    f32 values (an f64 program stays byte-identical) stay calls, painted
    inside with one decision for all their call sites. `level=O0` keeps
    every call.

    *Storage* (`storage=compute`, the default on every target). A value has
    one dtype, so f32 arithmetic would also mean f32 memory. With storage
    `compute`, a large f32 result of f32 arithmetic is rounded to the compute
    dtype right after its producer and read back in f32 by its f32 readers;
    XLA fuses both converts, and keeps only the rounded buffer when no reader
    reads the f32 original (measured on XLA:CPU). A value is stored low when
    it has at least `storage-min-elements` elements (4096 by default), is
    made by arithmetic (a dot, a
    transcendental or elementwise arithmetic; not data movement, which
    follows its operand), is not a statistic (a reduction's result, or what
    elementwise arithmetic makes of statistics and constants alone: mean,
    variance, the softmax max and sum), is not cheap to rebuild (what
    add, subtract, multiply, divide or data movement makes of arguments,
    constants, statistics and stored values alone, such as layer norm's
    `x - mean` and `(x - mean) * rsqrt(var)`: XLA recomputes it in its
    readers' fusions, and a rounded copy would only add memory), is not
    normalised data made by f32 arithmetic (`x - mean` and what multiplying
    or dividing by statistics makes of it, when `x` did not come from a
    low-precision op: batch norm's backward pass cancels across it, and
    rounding it raised the flax ResNet training step's error against f32
    4.7x on cpu, where its convolutions run in f32), is read
    only by painted arithmetic
    in its own block (not by a result, a custom call, a loop, a call, or an
    op kept f32 on purpose), does not feed a decision or linear algebra, and
    either every reader rounds it anyway or it is read again across a matrix
    multiply (as the backward pass reads saved activations): only then does
    XLA keep it in memory. On gpu/tpu such a dot result is made in the
    compute dtype by the GEMM itself (it accumulates in f32 and rounds once).
    The loss, gradients (read by the gradient marker), optimizer updates (no
    matrix multiply follows them) and master parameters stay f32.

    *Surviving XLA.* Each stored value's rounding is held by a
    `stablehlo.optimization_barrier` between its two converts. XLA:GPU's
    `simplify-fp-conversions` (on under the default
    `xla_allow_excess_precision=true`) replaces any chain of converts by one
    convert, so `f32 -> bf16 -> f32` would become the f32 original: a
    deviceless H100 compile of the LM step kept 0 of 20 stored values
    without the barrier and 25 of 25 with it (0.78x -> 0.69x f32 memory;
    with the flag off instead, 0.69x: the barrier costs nothing measurable,
    and it is in the program, where flags a user's jit sets cannot undo
    it). XLA expands barriers after scheduling on GPU; XLA:CPU expands them
    before fusion and keeps bf16 stored values anyway, but fuses f16 ones
    into their f32 readers. The rounding convert of stored value N carries
    the XLA frontend attribute `amp_stored = "N"`, which XLA copies onto the
    compiled program's instructions: the driver reads the optimized program
    and says which stored values are low-precision buffers
    (`bench/gpu_compile.py`).

    *Strict* (`strict=true`): every rounding the painted module describes
    happens in the compiled program, whatever XLA's flags. What an op
    without regions computes in the compute dtype stays f32 and is rounded
    right after it is made by `stablehlo.reduce_precision` to the compute
    dtype's exponent and mantissa bits; its f32 inputs are rounded where
    they are read; data movement, max, min and select of rounded values are
    rounded already; matrix multiplies take real compute-dtype operands (an
    exact convert) and their results are rounded by a convert, not made in
    the compute dtype. XLA computes low-precision elementwise arithmetic in
    f32 and drops the roundings between ops (excess precision); it never
    drops a reduce_precision. Values between fusions are then f32 (more
    memory than the default form), and for f16, reduce_precision flushes to
    zero what f16 would hold as a subnormal. On XLA:CPU the compiled program
    equals a NumPy interpretation of the painted module bit for bit
    (test/python/test_strict.py).

    *Per-layer control* (`scopes=PATTERN=CHOICE,...`). An op's scope path
    is the name JAX gives it less the primitive, the leading `jit(f)` and
    JAX's wrappers (`jit(loss)/transpose(jvp(Net))/head/dot_general` is in
    `Net/head`): named scopes and flax or equinox module paths, the same in
    the forward and the backward pass. Each PATTERN is a POSIX extended
    regular expression searched in it; the pattern with the longest match
    decides, and two matches of the same length are an error. `f32` keeps
    every float op of the scope f32 (dots take f32 operands and make an f32
    result), `compute` forces them into the compute dtype (as
    `force-compute` does), `f8` is for amp-fp8-gemms (and needs a `gemm=`
    FP8 policy). A scope's choice wins over `keep-f32`, `force-compute`
    and a dot's own precision. A pattern that matches no scope is an error
    naming the nearest ones.

    *Explicit precision*: a `dot_general` or `convolution` whose
    `precision_config` asks for `HIGHEST` or `HIGH` on an operand stays f32
    (XLA then computes it as asked: f32, or bf16_3x / TF32 for `HIGH`).

    Calibration groups: each matrix multiply that may go low opens a group
    (numbered in program order); `keep-groups` keeps the listed ones in f32.
    With `report=true` each op carries its decision (`amp.decision`).

    On the `cpu` target every lowered `dot_general` is rewritten to the
    NT-canonical form XLA:CPU executes natively (`[B, M, K] x [B, N, K]`), and
    convolutions stay f32 (XLA:CPU has no low-precision convolution kernel).

    Before:
    ```mlir
    func.func @main(%w: tensor<8x8xf32>, %x: tensor<4x8xf32>) -> tensor<4x8xf32> {
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
      %1 = stablehlo.exponential %0 : tensor<4x8xf32>
      return %1 : tensor<4x8xf32>
    }
    ```
    After `amp-insert-converts{policy=p=f32,c=bf16,o=f32 target=gpu}`:
    ```mlir
    func.func @main(%w: tensor<8x8xf32>, %x: tensor<4x8xf32>) -> tensor<4x8xf32> {
      %0 = stablehlo.convert %w : (tensor<8x8xf32>) -> tensor<8x8xbf16>
      %1 = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xbf16>
      %2 = stablehlo.dot_general %1, %0, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
      %3 = stablehlo.exponential %2 : tensor<4x8xf32>
      return %3 : tensor<4x8xf32>
    }
    ```
    Storage, before (`%e` is large and read again after the second dot):
    ```mlir
    %e = stablehlo.exponential %d1 : tensor<64x128xf32>
    %d2 = stablehlo.dot_general %xb, %w2b, ... -> tensor<64x128xf32>
    %r = stablehlo.multiply %e, %d2 : tensor<64x128xf32>
    ```
    After (`storage=compute`):
    ```mlir
    %e = stablehlo.exponential %d1 : tensor<64x128xf32>
    %s = stablehlo.convert %e : (tensor<64x128xf32>) -> tensor<64x128xbf16>
    %b = stablehlo.convert %s : (tensor<64x128xbf16>) -> tensor<64x128xf32>
    %d2 = stablehlo.dot_general %xb, %w2b, ... -> tensor<64x128xf32>
    %r = stablehlo.multiply %b, %d2 : tensor<64x128xf32>
    ```
  }];
  let options = [
    Option<"policy", "policy", "std::string",
           "::mlir::amp::kDefaultPolicy.str()",
           "Precision policy: p=PARAM,c=COMPUTE,o=OUTPUT[,gemm=GEMM] (jmp "
           "grammar)">,
    Option<"level", "level", "std::string", "\"\"",
           "O0 (no change), O1 (allow ops only), O2 (painting), O3 (all float "
           "ops); default: the target's (O1 on cpu, O2 on gpu and tpu)">,
    Option<"target", "target", "std::string",
           "::mlir::amp::targetName(::mlir::amp::kDefaultTarget).str()",
           "Backend the module runs on: cpu, gpu or tpu">,
    Option<"dotResult", "dot-result", "std::string", "\"\"",
           "Result dtype of lowered dot_general/convolution: f32 or compute "
           "(default: compute on gpu and tpu when the compute dtype is bf16, "
           "else f32)">,
    Option<"storage", "storage", "std::string", "\"\"",
           "Storage of large f32 results: f32 or compute (default: the "
           "target's, see the description)">,
    ListOption<"keepF32", "keep-f32", "std::string",
               "Op names forced to stay f32 (e.g. stablehlo.tanh or tanh)">,
    ListOption<"forceCompute", "force-compute", "std::string",
               "Op names forced into the compute dtype">,
    ListOption<"scopes", "scopes", "std::string",
               "Per-layer overrides PATTERN=CHOICE: the ops whose scope path "
               "(`Net/head`) the regular expression matches stay f32, "
               "compute in the compute dtype, or with gemm=f8 are the only "
               "GEMMs put in FP8 (f32, compute, f8; the longest match "
               "wins)">,
    ListOption<"keepGroups", "keep-groups", "int64_t",
               "Calibration groups (numbers from the report) kept in f32">,
    Option<"storageMinElements", "storage-min-elements", "int64_t", "4096",
           "Results with fewer elements keep f32 storage (per-row statistics "
           "and scalars cost nothing to keep)">,
    Option<"strict", "strict", "bool", "false",
           "Every rounding in a form XLA keeps: low-precision elementwise "
           "results stay f32, rounded by reduce_precision (see the "
           "description)">,
    Option<"decisions", "decisions", "std::string",
           "::mlir::amp::decisionsName(::mlir::amp::kDefaultDecisions).str()",
           "What a discrete decision (top_k, argmax, sort) keeps in f32: "
           "gate (from the nearest matrix multiply up to the decision) or "
           "exact (everything upstream: its choices equal f32's)">,
    Option<"reduceDtype", "reduce-dtype", "std::string",
           "::mlir::amp::reduceDtypeName(::mlir::amp::kDefaultReduceDtype).str()",
           "Result dtype of the backward pass's matrix multiplies, whose "
           "partial sums SPMD partitioning reduces across devices (the "
           "gradient reduce-scatter): f32, or compute (the compute dtype, "
           "also by its name)">,
    Option<"report", "report", "bool", "false",
           "Attach each op's decision as an `amp.decision` attribute, and "
           "mark inserted converts `amp.inserted`">,
  ];
}

def AmpSimplifyConvertsPass : Pass<"amp-simplify-converts", "::mlir::ModuleOp"> {
  let summary = "Removes converts that change nothing or round-trip exactly.";
  let description = [{
    Folds `convert(x : T) -> T`, an exact round trip `convert(convert(x : A) -> B) -> A`
    when B holds every value of A (bf16 -> f32 -> bf16), and merges duplicate
    converts of one value to one type. A conversion that can lose information
    (f32 -> bf16 -> f32) is never removed.

    Before:
    ```mlir
    %0 = stablehlo.convert %x : (tensor<4xbf16>) -> tensor<4xf32>
    %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xbf16>
    %2 = stablehlo.convert %1 : tensor<4xbf16>
    ```
    After:
    ```mlir
    %0 = stablehlo.convert %x : (tensor<4xbf16>) -> tensor<4xf32>   // kept if used elsewhere
    // uses of %1 and %2 now use %x
    ```
  }];
}

def AmpFp8GemmsPass : Pass<"amp-fp8-gemms", "::mlir::ModuleOp"> {
  let summary = "Puts eligible matrix multiplies into scaled FP8: a dot on "
                "FP8 operands times their scales, which XLA compiles to an "
                "FP8 GEMM.";
  let description = [{
    Runs after `amp-insert-converts`. Each `dot_general` whose operands are
    in a low-precision float dtype and that is eligible gets FP8 operands,
    each scaled by `scaling`:

    - `current` (per tensor): `amax = max|x|` in the graph;
    - `delayed` (per tensor): the max of an amax history carried as state
      (one `f32[N]` argument and result per operand, marked
      `amp.amax_history`, the result also `amp.state_of` its argument so a
      skipped step keeps the history; the history is rolled and the current
      amax inserted; an all-zero history falls back to the current amax);
    - then `scale = max(amax / fmax, FLT_MIN)` with `fmax` = 448 (e4m3fn)
      or 57344 (e5m2), and `q = convert(clamp(-fmax, x / scale, fmax))` to
      FP8 (the clamp saturates: no value becomes inf or NaN);
    - `rowwise`: one amax per row, over the operand's contracting
      dimensions (the backward pass's dots, being dots of their own,
      re-quantize along their own contraction), the scale taken as one
      reduction, the max of `|x| / fmax` from `FLT_MIN` (so that XLA makes
      no kernel for an elementwise step between the amax and its readers);
    - the FP8 values feed the dot directly (XLA's simplify-fp-conversions
      would fold any convert chain between them), which accumulates in f32
      and is multiplied by the scales, broadcast along the result's rows
      and columns: the form XLA:GPU keeps as an FP8 GEMM with the scaling
      in its epilogue.
    - `mxfp8`: E4M3 data in blocks of 32 along the (last) contracting
      dimension, each with a power-of-two scale rounded up,
      `2^(floor(log2 amax) - 8 + [mantissa(amax) > 1.75])` (the smallest
      one that keeps the block within 448), clamped to [2^-126, 2^127]
      (E8M0 reaches 2^-127, but f32 holds that only as a subnormal, which
      XLA flushes to zero), NaN for a block holding inf or NaN. With
      `mx-form=composite` the dot becomes `stablehlo.composite
      "xla.scaled_dot"` on the codes and their E8M0 scales (XLA:GPU makes
      it a block-scaled GEMM; its decomposition, which XLA:CPU runs, is
      the dequantized dot); with `mx-form=dequantize`, the dequantized
      operands feed the original dot (every JAX version). A program XLA's
      SPMD partitioner splits (`mhlo.num_partitions` > 1) gets the
      dequantized form whatever `mx-form` says: XLA (JAX 0.10) fails to
      partition the composite, and the report says so.

    `gemm=f8` gives forward operands e4m3fn and gradient operands e5m2 (not
    with mxfp8, which is e4m3 throughout): an operand is a gradient when it
    is derived from the loss cotangent seed (`amp.loss_seed`) or from an
    argument marked `amp.cotangent`. `gemm=f8e4m3fn` / `gemm=f8e5m2` use
    that format for every operand.

    Eligible: static shapes, no batch dimensions (the linear layers; batched
    attention products stay in the compute dtype, as in Transformer
    Engine), the contracting and free sizes of both operands multiples of
    16 (cuBLASLt's FP8 requirement), with mxfp8 a contraction that is a
    multiple of 32, and an effective size `M*N/(M+N)` of at least
    `min-size` (the entry points default it to the target's roofline:
    smaller GEMMs would be slower in FP8, their quantization costing more
    than FP8 saves). With per-tensor current scaling, an operand another
    FP8 GEMM of the same block quantizes in the same format shares that
    quantization and leaves the sum: `M*N/N` or `M*N/M`, and no limit when
    both are shared (a weight gradient reads the FP8 activation of its
    forward GEMM). With `report=true` each dot's decision gets a `gemm`
    entry: its operand formats and scaling, or why it is not eligible, with
    that reason's contract id as `gemm_reason` (`dimensions_unreadable`,
    `dynamic_shapes`, `batch_dimensions`, `size_not_multiple_of_16`,
    `both_e5m2`, `contraction_not_multiple_of_32`, `too_small`, `kept`, `scope`), and
    its place among the module's low-precision dots in program order as
    `gemm_index`. `keep-gemms` names dots by that place and keeps them in
    the compute dtype (`kept`): the GEMMs whose statistics
    (`amp-numerics{collect=stats}`) show that FP8 loses too much. The
    places do not depend on which dots become FP8. `scopes` takes the
    entries of amp-insert-converts' option: with an `f8` entry only the
    GEMMs of `f8` scopes go FP8, and a `compute` scope's GEMMs never do
    (`gemm_reason` `scope`).

    Before (after `amp-insert-converts`):
    ```mlir
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
        : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>
    ```
    After `amp-fp8-gemms{gemm=f8}` (the lhs; the rhs is alike):
    ```mlir
    %a = stablehlo.reduce(%abs init: %zero) applies stablehlo.maximum ...
    %s = stablehlo.maximum(stablehlo.divide(%a, 448), FLT_MIN)
    %c = stablehlo.clamp %neg_max, stablehlo.divide(%xf32, %s_b), %max
    %q = stablehlo.convert %c : (tensor<32x64xf32>) -> tensor<32x64xf8E4M3FN>
    %p = stablehlo.dot_general %q, %qw, contracting_dims = [1] x [0]
        : (tensor<32x64xf8E4M3FN>, tensor<64x16xf8E4M3FN>) -> tensor<32x16xf32>
    %d = stablehlo.multiply %p, (broadcast of %s * %sw)
    ```
  }];
  let options = [
    Option<"gemm", "gemm", "std::string", "\"f8\"",
           "FP8 operand format: f8 (e4m3fn forward, e5m2 gradients), "
           "f8e4m3fn or f8e5m2">,
    Option<"scaling", "scaling", "std::string", "\"current\"",
           "How operands are scaled: current or delayed (per tensor, from "
           "this step's amax or an amax history carried as state), rowwise "
           "(per row of the non-contracting dimensions) or mxfp8 (E4M3 in "
           "blocks of 32 along the contraction with E8M0 scales)">,
    Option<"amaxHistory", "amax-history", "int64_t", "16",
           "Length of the amax history with delayed scaling">,
    Option<"minSize", "min-size", "int64_t", "0",
           "The least effective size M*N/(M+N) of a GEMM put in FP8 "
           "(smaller ones would be slower); 0 puts every eligible GEMM in "
           "FP8">,
    ListOption<"keepGemms", "keep-gemms", "int64_t",
               "Low-precision dots (their `gemm_index` in the report: "
               "program order) kept in the compute dtype">,
    ListOption<"scopes", "scopes", "std::string",
               "amp-insert-converts' PATTERN=CHOICE entries: with an f8 "
               "entry only the GEMMs of f8 scopes go FP8; compute scopes' "
               "GEMMs stay in the compute dtype">,
    Option<"mxForm", "mx-form", "std::string", "\"composite\"",
           "How an mxfp8 GEMM is written: composite (xla.scaled_dot; "
           "dequantized in a partitioned program) or dequantize "
           "(dequantized operands into the original dot)">,
    Option<"report", "report", "bool", "false",
           "Add each dot's FP8 decision to its `amp.decision` attribute">,
  ];
}

def AmpRematerializePass : Pass<"amp-rematerialize", "::mlir::ModuleOp"> {
  let summary = "Recomputes cheap elementwise residuals in the backward pass "
                "from values the backward pass keeps anyway.";
  let description = [{
    Runs on a training step (a public function with an argument marked
    `amp.loss_seed`, or a derived vjp program with `amp.cotangent`
    arguments), after `amp-insert-converts` and `amp-fp8-gemms` and before
    `amp-loss-scale`. The backward pass is what is derived from those
    arguments; its residuals are the values of the forward pass it reads,
    which XLA keeps in memory from the forward pass to their last reader.

    In program order, each residual of at least `min-elements` elements that
    an elementwise op (or a broadcast or reshape) makes is recomputed right
    before its first reader in the backward pass, when everything its
    recomputation reads is kept for the backward pass anyway: another
    residual that is kept, a value at least 64 times smaller (a per-row
    statistic, a scale), a constant, or a value from outside its block.
    Anything else (a matrix multiply's result, a reduction over a large
    value, a value stored low) stops it, and the residual is kept. So is a
    residual made from arguments alone (a parameter's compute-dtype copy):
    a barrier on an argument cost XLA 16 MiB of temporaries on the MLP step
    and saved nothing on the LM. The
    recomputation is at most `max-ops` ops; residuals first read by the same
    op share one.

    The recomputation reads its leaves through one
    `stablehlo.optimization_barrier`: XLA's common-subexpression elimination
    would otherwise merge it with the forward pass's own ops, and the
    residual would be kept after all (jax.checkpoint uses the same barrier).
    XLA expands the barrier after scheduling; it costs no copy.

    Measured (deviceless H100 compile of the LM training step, d_model 1024,
    4 layers, seq 512, batch 16, Adam, bf16): GELU's tanh and product and
    softmax's normalised probabilities are recomputed from the up
    projection's result and the stored exponential; see README "XLA:GPU".

    Before (a GELU-like residual, `%t` read by the backward pass):
    ```mlir
    %u = stablehlo.dot_general %x, %w ...
    %t = stablehlo.tanh %u : tensor<64x128xf32>
    ...                                  // backward pass, from %seed:
    %g = stablehlo.multiply %dy, %t      // reads %t and %u
    %h = stablehlo.multiply %g, %u
    ```
    After:
    ```mlir
    %u = stablehlo.dot_general %x, %w ...
    %t = stablehlo.tanh %u : tensor<64x128xf32>
    ...
    %held = stablehlo.optimization_barrier %u : tensor<64x128xf32>
    %t2 = stablehlo.tanh %held : tensor<64x128xf32>
    %g = stablehlo.multiply %dy, %t2
    %h = stablehlo.multiply %g, %u
    ```
  }];
  let options = [
    Option<"minElements", "min-elements", "int64_t", "4096",
           "Residuals smaller than this are kept">,
    Option<"maxOps", "max-ops", "int64_t", "64",
           "The most ops one recomputation may take">,
  ];
}

def AmpRoundStatePass : Pass<"amp-round-state", "::mlir::ModuleOp"> {
  let summary = "Stores a training step's new state in low precision: "
                "bf16 parameters rounded from their f32 update (to nearest, "
                "stochastically or with Kahan compensation) and optimizer "
                "state in bf16 or 8-bit blocks.";
  let description = [{
    Runs on a training step after `amp-insert-converts` and before
    `amp-loss-scale`. A result of the public `main` marked
    `amp.state_of = N` (the new value of argument N: a parameter, an
    optimizer state) whose argument is bf16 gets its value from f32
    arithmetic and one convert to bf16 before the return. That convert
    rounds to nearest: with `p=bf16`, an update smaller than half a bf16
    ulp of the parameter (2^-9 of it) is lost every step, and training
    stalls where f32 master weights keep moving.

    With `rounding=stochastic` each such convert is replaced by unbiased
    stochastic rounding: a random 16-bit word is added to the f32 value's
    bit pattern and the sum is truncated to bf16, which rounds up with
    probability equal to the distance from the lower bf16 neighbour in
    units of its ulp. So the expected bf16 value is the f32 value.
    Non-finite values round to nearest. The randomness comes from
    `stablehlo.rng_bit_generator` (THREE_FRY), one call per rounded value,
    chained, each drawing a `ui32[2]` key for its tensor: its state is a
    `ui32[4]` argument the pass appends (marked `amp.rounding_key`), and
    the next state is a result it appends (marked `amp.rounding_key` and
    `amp.state_of` its argument), so the step stays a pure function of its
    state, and `amp-loss-scale` keeps the old state on a skipped step: an
    overflowed step changes nothing. Each element's word is the top half of
    a hash of its index under the tensor's key (two rounds of the lowbias32
    integer hash), elementwise on an iota: it fuses into the update and
    shards like the parameter. Bits drawn from rng_bit_generator at the
    parameter's shape would be a buffer as large as the parameter, which
    XLA:CPU computes before the backward pass and keeps until the update
    (6 MiB of the peers' LM's temporaries).

    With `rounding=kahan` each such convert rounds to nearest, and the
    rounding error is not lost but carried: the pass appends a bf16
    argument per rounded parameter, its compensation buffer (marked
    `amp.compensation = N`, N the parameter's argument), and returns its
    next value (marked `amp.compensation = N` and `amp.state_of` the
    buffer's argument). Each step computes `sum = new + f32(c)`, returns
    `bf16(sum)` and keeps `c' = bf16(sum - f32(bf16(sum)))`. Parameter and
    buffer together take 4 bytes per parameter, as an f32 master weight
    does, and each update is applied with about 16 bits of mantissa
    (Kahan-compensated optimizers in optimi; Revisiting BFloat16 Training,
    arXiv 2010.06192). The rounded sum is taken in f32 by
    `stablehlo.reduce_precision`, which XLA never folds (a convert to bf16
    and back would be folded into `sum` itself by XLA:GPU's
    simplify-fp-conversions, leaving a zero compensation). A skipped step
    keeps the old buffers with the old parameters.

    With `optimizer-state=bf16`, the f32 arguments marked
    `amp.optimizer_state` (a front end marks the float leaves of the
    optimizer's state: Adam's moments, momentum) become bf16 arguments read
    back in f32 where they are used, and their new values (the results
    marked `amp.state_of` them) are rounded to bf16 to nearest, whatever
    `rounding` says: 2 bytes per moment instead of 4, the update itself
    still in f32. The marker is consumed. The moment's other readers (the
    parameter's update) read the stored moment widened back, through its
    bits (XLA folds a convert pair back into the f32 value): then the
    stored moment is the one value the step computes from the old one.
    Reading the f32 value, the update recomputes it from the old moment,
    and XLA:CPU copies every old moment of a donated state to keep it for
    that second reader. The update sees the moment rounded once more, a
    relative change of at most 2^-9, the value the next step reads anyway. Moments are not rounded
    stochastically: a moment's rounding error decays by its β every step
    instead of accumulating the way a parameter's does, and the random
    words cost more memory than the moments save (the peers' MLP with Adam
    on XLA:CPU: 1.38x f32's memory total with stochastic moments, 0.84x
    with moments rounded to nearest).

    With `optimizer-state=f8` each marked f32 tensor becomes a ui8
    argument of blocks of 260 bytes: per block of 256 elements of the
    row-major tensor, the FP8 E4M3 codes of
    r = sign(x) * sqrt(|x|), scaled so the block's largest |r| is 448
    (E4M3's largest), then the block's f32 scale as 4 bytes (block-scaled
    8-bit state, as bitsandbytes' and torchao's 8-bit optimizers keep, with
    companded E4M3 codes in place of their quantization maps). The square
    root halves the decades a block's second moments span; a nonzero r
    below E4M3's smallest code (2^-9) is stored as that code, not zero: a
    second moment flushed to zero under a nonzero first moment makes Adam's
    step lr * m / eps (it diverged the peers' MLP within 30 steps), rounded
    up it only makes that step smaller. The blocks keep as many of the
    tensor's leading dimensions as hold whole blocks (`d0 x .. x dk x B x
    260`; a tensor<1024x4096xf32> is ui8[1024, 16, 260]), so a sharded
    tensor's blocks stay on its devices; where none do, the tensor is
    flattened and zero-padded (`ui8[ceil(N/256), 260]`). It is decoded to
    f32 where it is read and its new value encoded before the return. The
    update reads the f32 value, as bitsandbytes' and torchao's 8-bit
    optimizers do, not the decoded code (reading the code, XLA:CPU would
    keep no copy of the old blocks, as with bf16 moments, but each step
    would take the code's error, up to 2^-4 of a block's largest root).
    About 1.016 bytes per
    element; the front end encodes the optimizer's first state the same
    way.

    A step exported without these marks (a plain `jax.jit` training step)
    names them with `state-results=R:N` (result R is the new value of
    argument N; the pass marks it `amp.state_of = N`, which
    `amp-loss-scale` reads next) and `optimizer-state-args=N,...`.

    `rounding=nearest` with `optimizer-state=f32` (the defaults) leaves the
    module unchanged. f16 state is neither rounded stochastically (its bits
    are not the top half of an f32's) nor compensated; it keeps its
    convert.

    Before:

    ```mlir
    func.func public @main(%w: tensor<4xbf16>, %u: tensor<4xf32>)
        -> (tensor<4xbf16> {amp.state_of = 0 : i64}) {
      %0 = stablehlo.convert %w : (tensor<4xbf16>) -> tensor<4xf32>
      %1 = stablehlo.add %0, %u : tensor<4xf32>
      %2 = stablehlo.convert %1 : (tensor<4xf32>) -> tensor<4xbf16>
      return %2 : tensor<4xbf16>
    }
    ```

    After (`rounding=stochastic`; the key's bitcasts to and from ui64[2]
    are left out):

    ```mlir
    func.func public @main(%w: tensor<4xbf16>, %u: tensor<4xf32>,
        %key: tensor<4xui32> {amp.rounding_key})
        -> (tensor<4xbf16> {amp.state_of = 0 : i64},
            tensor<4xui32> {amp.rounding_key, amp.state_of = 2 : i64}) {
      ...
      %next, %key4 = "stablehlo.rng_bit_generator"(%state)  // 2xui32
      %index = stablehlo.iota dim = 0 : tensor<4xui32>
      %noise = ...  // hash(hash(%index ^ key[0]) + key[1]) >> 16
      %x = stablehlo.bitcast_convert %1 : (tensor<4xf32>) -> tensor<4xui32>
      %sum = stablehlo.add %x, %noise
      %cut = stablehlo.and %sum, %high16
      %y = stablehlo.bitcast_convert %cut : (tensor<4xui32>) -> tensor<4xf32>
      %z = stablehlo.select %finite, %y, %1
      %2 = stablehlo.convert %z : (tensor<4xf32>) -> tensor<4xbf16>
      ...
    }
    ```
  }];
  let options = [
    Option<"rounding", "rounding", "std::string", "\"nearest\"",
           "How a step's new bf16 parameters are rounded from their f32 "
           "update: nearest, stochastic (unbiased; a random-bit state is "
           "appended) or kahan (to nearest, with a bf16 compensation buffer "
           "per parameter appended)">,
    Option<"optimizerState", "optimizer-state", "std::string", "\"f32\"",
           "Dtype the optimizer state (arguments marked amp.optimizer_state "
           "and their new values) is stored in: f32, bf16, or f8 (FP8 E4M3 "
           "codes with an f32 scale per block of 256); the update still "
           "computes in f32">,
    ListOption<"stateResults", "state-results", "std::string",
               "RESULT:ARG pairs: result RESULT is the new value of argument "
               "ARG (marks it amp.state_of, for a step exported without the "
               "marks)">,
    ListOption<"optimizerStateArgs", "optimizer-state-args", "unsigned",
               "Indices of arguments that are optimizer state (marks them "
               "amp.optimizer_state)">,
  ];
}

def AmpLossScalePass : Pass<"amp-loss-scale", "::mlir::ModuleOp"> {
  let summary = "Fuses loss scaling, gradient unscaling, the overflow check "
                "and the dynamic scale update into a training-step module.";
  let description = [{
    Works on the public function `main` of a training step built with the
    loss cotangent seed as an argument (`jax.vjp(loss, params)` then
    `vjp(seed)`):
    - the seed argument (marked `amp.loss_seed`, or `seed-arg=N`) is
      multiplied by a new f32 scalar argument, the loss scale, so scaling
      enters the backward pass exactly where autodiff starts;
    - each gradient (the operands of a `stablehlo.custom_call
      @stablehlo_amp.gradients`, which is removed, or results marked
      `amp.gradient` or named by `gradient-results`) is multiplied once by the
      reciprocal of the scale, in f32;
    - `is_finite` of every unscaled gradient is reduced with AND into one
      predicate, appended as a result (`amp.grads_finite`);
    - results holding the new value of an argument (marked
      `amp.state_of = N`, or `state-results=R:N`) become
      `select(finite, new, old)`, so an overflowed step changes nothing;
    - with `mode=dynamic` a second new argument, the counter of finite steps
      (i32), drives the update: on overflow
      `scale = max(min-scale, scale * backoff-factor)` and the counter resets;
      after `growth-interval` finite steps the scale grows by `growth-factor`
      unless that overflows f32 or passes `max-scale`; the new scale and
      counter are appended as results (`amp.loss_scale`,
      `amp.loss_scale_counter`).
    `mode=static` scales by the given argument without updating it;
    `mode=none` adds no scale argument and only checks: it keeps the old
    state only with `check-state=true`.
    With `check-state=true` a step is also skipped when a float value of
    its new state is not finite (finite gradients can still make it so:
    an update that overflows a bf16 parameter, a division by a zero
    moment); that check is appended as a last result (`amp.state_finite`),
    and the scale's update still follows the gradients alone. The new
    state must then be complete before any of it is written: with the state
    donated, XLA keeps the new values beside the old ones.

    Before:
    ```mlir
    func.func @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed})
        -> (tensor<8xf32> {amp.gradient}) {
      %g = stablehlo.multiply %w, %seed_broadcast : tensor<8xf32>
      return %g : tensor<8xf32>
    }
    ```
    After `amp-loss-scale{mode=dynamic}` (sketch):
    ```mlir
    func.func @main(%w: tensor<8xf32>, %seed: tensor<f32>, %scale: tensor<f32>,
                    %counter: tensor<i32>)
        -> (tensor<8xf32>, tensor<i1>, tensor<f32>, tensor<i32>) {
      %scaled_seed = stablehlo.multiply %seed, %scale : tensor<f32>
      ...                                   // backward pass on %scaled_seed
      %inv = stablehlo.divide %one, %scale : tensor<f32>
      %g_unscaled = stablehlo.multiply %g, %inv_broadcast : tensor<8xf32>
      %finite = stablehlo.reduce(%is_finite ...) applies stablehlo.and ...
      ...                                   // new scale and counter
      return %g_unscaled, %finite, %new_scale, %new_counter : ...
    }
    ```
  }];
  let options = [
    Option<"mode", "mode", "std::string",
           "::mlir::amp::lossScaleModeName(::mlir::amp::LossScaleConfig().mode).str()",
           "dynamic (scale updated in the graph), static, or none">,
    Option<"seedArg", "seed-arg", "int", "-1",
           "Index of the loss cotangent seed argument (default: the argument "
           "marked amp.loss_seed)">,
    ListOption<"gradientResults", "gradient-results", "unsigned",
               "Indices of results that are gradients">,
    ListOption<"stateResults", "state-results", "std::string",
               "RESULT:ARG pairs: result RESULT is the new value of argument ARG">,
    Option<"growthInterval", "growth-interval", "int64_t",
           "::mlir::amp::LossScaleConfig().growthInterval",
           "Finite steps before the scale grows">,
    Option<"growthFactor", "growth-factor", "double",
           "::mlir::amp::LossScaleConfig().growthFactor",
           "Factor the scale grows by">,
    Option<"backoffFactor", "backoff-factor", "double",
           "::mlir::amp::LossScaleConfig().backoffFactor",
           "Factor the scale shrinks by on overflow">,
    Option<"minScale", "min-scale", "double",
           "::mlir::amp::LossScaleConfig().minScale",
           "Floor of the scale (may be below 1)">,
    Option<"maxScale", "max-scale", "double",
           "::mlir::amp::LossScaleConfig().maxScale",
           "Ceiling of the scale">,
    Option<"checkState", "check-state", "bool", "false",
           "Also skip a step whose new state (a result marked amp.state_of, "
           "float) is not finite, and append that check (amp.state_finite)">,
  ];
}

def AmpNumericsPass : Pass<"amp-numerics", "::mlir::ModuleOp"> {
  let summary = "Measures the numerics of a step inside it: range statistics "
                "of every low-precision GEMM operand, or where a non-finite "
                "value first appeared, as results of main.";
  let description = [{
    With `collect=stats`, for each low-precision GEMM of the public
    function `main` (a `dot_general` whose operands are both 16 bits wide
    or narrower, or an `xla.scaled_dot` composite), in program order, and
    for each of its two operands, the pass finds where the operand was
    rounded to its format: the convert from a wider float type, looked for
    through reshapes, transposes, slices, optimization barriers, an MXFP8
    dequantization and what a loop carries unchanged. From the value the convert rounds (after the FP8
    scale, before the clamp) it measures, exactly and with no host
    transfer:
    - `amax`: the largest magnitude of the operand before scaling (f32);
    - `nonzero`: how many values are not zero (NaN is not counted);
    - `underflow`: how many nonzero values round to zero in the format:
      `0 < |x| <= s / 2`, `s` the format's smallest subnormal (round to
      nearest even sends a tie to zero);
    - `saturated`: how many finite values the format cannot hold: above its
      largest finite value where the rounding clamps (FP8 GEMMs), or
      rounded to infinity where it does not (bf16, f16).
    An operand with no rounding at its GEMM (computed in its own format)
    gets its amax and nonzero count, and zero for the other two. Values are
    read as the device reads them: XLA:CPU flushes f32 subnormals to zero,
    so there no f32 value can underflow bf16 (whose smallest subnormal,
    2^-133, is an f32 subnormal).
    They are appended as two results: `amp.gemm_amax`, `f32[G, 2]`, and
    `amp.gemm_counts`, `i32[G, 2, 3]` (nonzero, underflow, saturated), with
    `G` the GEMMs measured, indexed as the report's `gemm_stats`; the
    rounding's format of each operand is the report's `gemm_stats_formats`
    (empty where there is none). The counts are exact below 2^31 values
    per operand.

    A GEMM in a `while` body (a `jax.lax.scan` over layers) is measured in
    the body and accumulated over the iterations (the larger amax, the
    counts summed) in values the loop carries from zeros, which leave it as
    more results. A rounding of what the loop carries unchanged, whole on
    every iteration (a scan's stacked weights), is measured once where it
    enters the loop, and a slice of a rounding counts as the rounding: the
    statistics of every layer's weights, each value once. GEMMs in
    conditionals (`if`, `case`) and in functions called from main are not
    measured.

    The reductions read the rounding's input next to the rounding, so XLA
    can fuse them into the kernel that writes the rounded value. The first
    GEMM that reads a measured operand has its result replaced by
    `result - min(counts, 0)`, exactly the result (-0 too), so that XLA
    measures before that GEMM runs rather than at the end of the step
    (where it would read a parameter after its in-place update, and copy
    it). It runs after amp-fp8-gemms, which makes the FP8 roundings it
    measures.

    With `collect=provenance`, the pass splits the body of `main` into
    regions: ops with the same name JAX gives them, less the primitive (their
    `jax.named_scope` or flax module path and JAX's transformations, so a
    module's forward pass and its backward pass (`transpose(jvp(...))`)
    differ) and the same innermost source line; region 0 is the step's
    inputs (main's arguments). An op with no such location joins the region
    of its first operand; constants and iotas are in none; a loop, a
    conditional or a call is one op of its region. For every float value a
    region hands on (read by another region, or returned) it reduces, next
    to the op that makes the value, whether the value holds a NaN and
    whether it holds an infinity (no host transfer), and ORs them into the
    region's two bits. The bits are appended as `amp.nonfinite`,
    `i32[2, W]`, `W = ceil(R / 32)` for `R` regions: row 0 NaN, row 1
    infinity, region `r` at bit `r % 32` of word `r / 32`. The regions, in
    bit order (the order of their first op), are listed on `main` as
    `amp.nonfinite_regions` and in the report: each one's first op's
    location, its primitives, the narrowest float type it hands on, and the
    regions it reads. The first region to go non-finite is then the earliest
    whose bits are set while those of every region it reads are clear.
    Readers wait for checks where XLA could otherwise check too late: the
    readers of a value XLA may compute from a donated input (it would copy
    the input), and the first elementwise reader of any other value of 64
    MiB or more (XLA would keep the value alive for a check it put off to
    the end), through an identity that XLA cannot compute before the
    check. Run it last but the loss scaling, so that it checks the values
    the step computes (amp-rematerialize's recomputations included).

    With `collect=none` the pass changes nothing.
  }];
  let options = [
    Option<"collect", "collect", "std::string",
           "::mlir::amp::numericsNames()[0].str()",
           "What the step measures of its own numerics: none, stats "
           "(range statistics of each low-precision GEMM operand) or "
           "provenance (which region first handed on a NaN or an "
           "infinity)">,
  ];
}

#endif // STABLEHLO_AMP_PASSES_TD
