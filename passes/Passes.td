//===- Passes.td - stablehlo-amp pass declarations ------------------------===//

#ifndef STABLEHLO_AMP_PASSES_TD
#define STABLEHLO_AMP_PASSES_TD

include "mlir/Pass/PassBase.td"

def AmpInsertConvertsPass : Pass<"amp-insert-converts", "::mlir::ModuleOp"> {
  let summary = "Paints every float value of a StableHLO module with a precision "
                "and inserts converts where precision changes.";
  let description = [{
    Decides for the whole module which f32 ops compute in the policy's
    compute dtype and which stay f32 (PrecisionAnalysis), then converts a
    value only where it crosses precisions, at most once per target type.

    - Levels: `O0` no change, `O1` allow ops only, `O2` painting, `O3`
      every float op (default `O1` on cpu, else `O2`).
    - Classes: *allow* (`dot_general`, `convolution`: compute-dtype
      operands, f32 accumulation, the result per `dot-result`); *deny*
      (transcendentals, sum and product reductions, batch norm, linear
      algebra: f32, and at O2 their elementwise readers too); *infer*
      (elementwise: follows its inputs, low between two allow ops at O2);
      *clear* (data movement, compare, select, max/min: never forces a
      convert). Custom calls, unknown ops, integers keep their types.
    - What feeds a discrete decision (sort keys, top-k, argmax, a compare
      that picks integers, an index or a branch, a float-to-int convert)
      stays f32 from the nearest matrix multiply on (`decisions=gate`;
      it reads a hidden state that other readers take in the compute
      dtype as that rounding, widened) or
      back to the inputs (`exact`); what feeds linear algebra, back through
      its producers. Private f32 functions are inlined per call site first.
    - Public functions' f32 arguments take the param dtype (not if marked
      `amp.keep_dtype`), f32 results the output dtype (`amp.state_of = N`:
      argument N's).
    - `storage=compute` (the default): a large f32 result of arithmetic
      read again across a matrix multiply is rounded after its producer,
      through an `optimization_barrier`, and read back in f32; not
      statistics, normalised data or cheap rebuilds (docs/storage.md).
    - bf16 on gpu and tpu: a backward multiply of a bf16 gradient by a
      forward value stays bf16. With `mhlo.num_partitions` > 1 so does a
      normalisation's backward term (centred data times a per-row gradient
      statistic), which the partitioner moves between devices; without,
      the module gets `amp.partition_dependent` (docs/sharding.md).
    - `strict=true`: every rounding as a `reduce_precision`. `target=cpu`:
      lowered dots in XLA:CPU's NT-canonical form, convolutions f32.
      `scopes=PATTERN=f32|compute`: the ops of matching scopes (longest
      match) stay f32 or go low; a dot asking `precision=HIGH(EST)` stays f32.

    Before, and after
    `amp-insert-converts{policy=p=f32,c=bf16,o=f32 target=gpu dot-result=f32}`:
    ```mlir
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    ```
    ```mlir
    %0 = stablehlo.convert %w : (tensor<8x8xf32>) -> tensor<8x8xbf16>
    %1 = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xbf16>
    %2 = stablehlo.dot_general %1, %0, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
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
    Runs after `amp-insert-converts`. Each eligible `dot_general` with
    low-precision operands becomes a dot of FP8 operands accumulating in
    f32, times the operands' scales: the form XLA:GPU keeps as an FP8 GEMM.
    An operand `x` is quantized as `q = convert(clamp(-fmax, x / s, fmax))`
    (`fmax` 448 for e4m3fn, 57344 for e5m2), its scale `s` by `scaling`:

    - `current`: `max(max|x| / fmax, FLT_MIN)`, per tensor; GEMMs of one
      block reading the same value in the same format share it;
    - `delayed`: from an amax history carried as state (an `f32[N]`
      argument and result per operand, `amp.amax_history`, kept on a
      skipped step; `amax-history` long);
    - `rowwise`: one scale per row, over the contracting dimensions;
    - `mxfp8`: E4M3 in blocks of 32 along the contraction with power-of-two
      (E8M0) scales; with `mx-form=composite` an `xla.scaled_dot` composite,
      else (or in a program XLA partitions) a dot of dequantized operands.

    `gemm=f8` gives forward operands e4m3fn and gradient operands (derived
    from `amp.loss_seed` or `amp.cotangent`) e5m2; `f8e4m3fn`/`f8e5m2` use
    one format. Eligible: static shapes, no batch dimensions, sizes
    multiples of 16 (32 for mxfp8's contraction), not both e5m2, not named
    by `keep-gemms` (places in program order, the report's `gemm_index`),
    and an effective size `M*N/(M+N)` (an operand quantized anyway leaves
    the sum) of at least `min-size`. With `report=true` each dot's decision
    gets `gemm` and, if not FP8, `gemm_reason`. `scopes` with an `f8`
    entry: only the GEMMs of `f8` scopes go FP8 (`gemm_reason` `scope`).

    Before, and after `amp-fp8-gemms{gemm=f8}` (the lhs; the rhs is alike):
    ```mlir
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
        : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>
    ```
    ```mlir
    %s = stablehlo.maximum(stablehlo.divide(%amax, 448), FLT_MIN)
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
    Runs on a training step (an argument marked `amp.loss_seed`, or
    `amp.cotangent` arguments), before `amp-loss-scale`. Its residuals are
    the forward values the backward pass reads.

    A residual elementwise ops make is recomputed before its first
    backward reader when that is free: every backward reader fuses it (an
    elementwise op, a reduction, a transpose; not a matrix multiply), and
    it reads only what is written anyway (a kept residual, a matrix
    multiply's result or a stored value no larger than it, a small value
    no row reduction makes, such as an FP8 scale's amax, a constant; a row
    max is recomputed too). It reads
    its leaves through one `stablehlo.optimization_barrier`, so that XLA's
    CSE does not merge it back. A softmax written out, `q = e / sum(e)`,
    that the loss reads through `q` alone and whose `q` a backward matrix
    multiply keeps anyway: the backward pass reads `q / sum(q)` for `e` and
    1 for the sum (softmax is shift-invariant: the same derivative), and
    keeps neither the logits nor the sum. `for=memory` recomputes every residual
    made from kept or small values, whatever reads it (docs/DESIGN.md,
    "Decisions with a price").

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
    Option<"goal", "for", "std::string", "\"speed\"",
           "What a recomputation may trade: speed (only what costs no "
           "kernel and no bytes, the default) or memory (every cheap "
           "recomputation from kept values, which splits XLA's fused "
           "normalizations)">,
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
    `amp.state_of = N` whose argument N is bf16 is an f32 value rounded by
    one convert before the return; `rounding` says how:

    - `nearest`: the convert as it is (an update below half an ulp is lost);
    - `stochastic`: unbiased; a random 16-bit word is added to the f32
      bits and the sum truncated to bf16 (non-finite values round to
      nearest). The words hash each element's index under a key that
      `stablehlo.rng_bit_generator` draws per tensor from a `ui32[4]`
      state the pass appends as argument and result (`amp.rounding_key`);
    - `kahan`: to nearest, with the rounding error carried in a bf16
      buffer per parameter appended as argument and result
      (`amp.compensation = N`): `sum = new + f32(c)`, the parameter
      `bf16(sum)`, `c' = bf16(sum - f32(bf16(sum)))`.

    Appended results are also `amp.state_of` their argument, so
    `amp-loss-scale` keeps them on a skipped step. `optimizer-state` stores
    arguments marked `amp.optimizer_state` and their new values (rounded to
    nearest whatever `rounding` says) in bf16, or in `f8`: `ui8` blocks of
    256 E4M3 codes of `sign(x) * sqrt(|x|)` and the block's f32 scale,
    keeping the leading dimensions that hold whole blocks; the update
    computes in f32. `state-results=R:N` and `optimizer-state-args` mark a
    step exported without the marks.

    Before, and after `amp-round-state{rounding=kahan}` (sketch):
    ```mlir
    func.func public @main(%w: tensor<4xbf16>, %u: tensor<4xf32>)
        -> (tensor<4xbf16> {amp.state_of = 0 : i64}) {
      %2 = stablehlo.convert %1 : (tensor<4xf32>) -> tensor<4xbf16>
    ```
    ```mlir
    func.func public @main(%w: tensor<4xbf16>, %u: tensor<4xf32>,
        %c: tensor<4xbf16> {amp.compensation = 0 : i64}) -> (...) {
      %sum = stablehlo.add %1, stablehlo.convert(%c) : tensor<4xf32>
      %r = stablehlo.reduce_precision %sum, format = e8m7 : tensor<4xf32>
      %2 = stablehlo.convert %r : (tensor<4xf32>) -> tensor<4xbf16>
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
    Works on the public `main` of a step with the loss cotangent seed as
    an argument (`jax.vjp(loss, params)`, then `vjp(seed)`):
    - the seed argument (`amp.loss_seed`, or `seed-arg=N`) is multiplied
      by a new f32 scalar argument, the loss scale;
    - each gradient (the operands of a `stablehlo.custom_call
      @stablehlo_amp.gradients`, which is removed, or results marked
      `amp.gradient` or named by `gradient-results`) is multiplied once by
      the reciprocal of the scale, in f32;
    - `is_finite` of every unscaled gradient is reduced with AND into one
      predicate, appended as a result (`amp.grads_finite`);
    - results holding the new value of an argument (`amp.state_of = N`, or
      `state-results=R:N`) become `select(finite, new, old)`;
    - `mode=dynamic` appends a counter of finite steps (i32): on overflow
      `scale = max(min-scale, scale * backoff-factor)` and the counter
      resets; after `growth-interval` finite steps the scale grows by
      `growth-factor` unless that passes `max-scale` or overflows f32; the
      new scale and counter are results (`amp.loss_scale`,
      `amp.loss_scale_counter`). `mode=static` scales without updating;
      `mode=none` scales nothing and checks nothing unless
      `check-grads=true`, and keeps the old state only with
      `check-state=true` (which checks both).
    With `check-state=true` a step whose new state holds a non-finite float
    is skipped too (`amp.state_finite`); the scale follows the gradients.

    Before, and after `amp-loss-scale{mode=dynamic}` (sketch):
    ```mlir
    func.func @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed})
        -> (tensor<8xf32> {amp.gradient}) {
    ```
    ```mlir
    func.func @main(%w: tensor<8xf32>, %seed: tensor<f32>, %scale: tensor<f32>,
                    %counter: tensor<i32>)
        -> (tensor<8xf32>, tensor<i1>, tensor<f32>, tensor<i32>) {
      %scaled_seed = stablehlo.multiply %seed, %scale : tensor<f32>
      ...                                   // backward pass on %scaled_seed
      %g_unscaled = stablehlo.multiply %g, %inv_broadcast : tensor<8xf32>
      %finite = stablehlo.reduce(%is_finite ...) applies stablehlo.and ...
      return %g_unscaled, %finite, %new_scale, %new_counter : ...
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
    Option<"checkGrads", "check-grads", "bool", "false",
           "Check the gradients without a loss scale too (mode=none) and "
           "append that check (amp.grads_finite); a loss scale always "
           "checks them">,
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
    Measures a step's numerics inside it, with no host transfer, as results
    appended to the public `main`. Run it last but `amp-loss-scale`.

    `collect=stats`: for each low-precision GEMM of `main` (a `dot_general`
    whose operands are 16 bits wide or narrower, or an `xla.scaled_dot`),
    in program order, and each operand, the pass finds the convert that
    rounded it to its format (through reshapes, transposes, slices,
    barriers, an MXFP8 dequantization and loop-carried values) and measures
    the value it rounds: `amax` (f32), and the counts of `nonzero` values,
    of nonzero values that round to zero (`underflow`), and of finite
    values the format cannot hold (`saturated`). An operand with no
    rounding gets its amax, nonzero count and zeros. They are appended as
    `amp.gemm_amax` (`f32[G, 2]`) and `amp.gemm_counts` (`i32[G, 2, 3]`),
    indexed as the report's `gemm_stats`. GEMMs in a `while` body are
    accumulated over the iterations (a loop-invariant rounding is measured
    once, before the loop); GEMMs in conditionals or called functions are
    not measured. Each first reader of a measured operand reads
    `result - min(counts, 0)` (exactly the result), so XLA measures early.

    `collect=provenance`: the body of `main` is split into regions (ops
    with the same name less the primitive, that is the same scope and
    transformation, and the same source line; region 0 is the arguments).
    For every float value a region hands on, the pass reduces next to its
    producer whether it holds a NaN and whether it holds an infinity, and
    ORs them into the region's bits, appended as `amp.nonfinite`
    (`i32[2, ceil(R / 32)]`: row 0 NaN, row 1 infinity, region r at bit
    r % 32 of word r / 32). The regions (`amp.nonfinite_regions` on main
    and in the report) list their first op's location, primitives,
    narrowest float type and input regions: the first to go non-finite is
    the earliest with bits set whose inputs' are clear. Readers of a value
    from a donated input, and the first elementwise reader of a value of
    64 MiB or more, wait for its check.

    `collect=none` changes nothing. After `amp-numerics{collect=stats}`:
    ```mlir
    func.func public @main(...) -> (..., tensor<1x2xf32> {amp.gemm_amax},
                                    tensor<1x2x3xi32> {amp.gemm_counts})
    ```
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
