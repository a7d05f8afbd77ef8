//===- RoundState.cpp - Stochastic rounding of a step's bf16 state --------===//
//
// amp-round-state: the new value of a bf16 parameter is computed in f32 and
// rounded once per step. Rounded to nearest, an update below half an ulp is
// lost. Rounded stochastically, the expected bf16 value is the f32 one, so
// bf16 master weights follow the f32 trajectory on average (Revisiting
// BFloat16 Training, arXiv 2010.06192; torchao's bf16_stochastic_round);
// the random bits come from a ui32[4] state the pass appends to the step,
// so the step stays a pure function of its state. With Kahan compensation
// a bf16 buffer per parameter carries each rounding's error into the next
// step (optimi's Kahan-compensated optimizers). See Passes.td.
//
//===----------------------------------------------------------------------===//

#include "Contract.h"
#include "PassSupport.h"
#include "Passes.h"
#include "StableHLO.h"
#include "TrainingStep.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/Sequence.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPROUNDSTATEPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// A convert from f32 to bf16 whose result `main` returns as the new value
/// of a bf16 argument (`amp.state_of`), and that argument's index.
struct RoundedState {
  Operation *convert;
  int64_t argument;
};

SmallVector<RoundedState> roundingConverts(func::FuncOp main) {
  Operation *terminator = main.front().getTerminator();
  SmallVector<RoundedState> converts;
  for (unsigned i = 0, e = main.getNumResults(); i < e; ++i) {
    auto stateOf = main.getResultAttrOfType<IntegerAttr>(i, attr::kStateOf);
    if (!stateOf)
      continue;
    Operation *def = terminator->getOperand(i).getDefiningOp();
    if (!def || !shlo::isConvert(def) ||
        llvm::any_of(converts, [&](const RoundedState &rounded) {
          return rounded.convert == def;
        }))
      continue;
    FloatType to = shlo::getFloatElementType(def->getResult(0).getType());
    FloatType from = shlo::getFloatElementType(def->getOperand(0).getType());
    auto shaped = dyn_cast<RankedTensorType>(def->getResult(0).getType());
    if (to && from && shaped && shaped.hasStaticShape() && to.isBF16() &&
        from.isF32())
      converts.push_back({def, stateOf.getInt()});
  }
  return converts;
}

/// The type optimizer-state=f8 stores a tensor of `type` as.
RankedTensorType blocksType(OpBuilder &builder, RankedTensorType type) {
  return RankedTensorType::get(
      OptimizerStateBlocks::storedShape(type.getShape()),
      builder.getIntegerType(8, /*isSigned=*/false));
}

/// The f32 value of `stored`, optimizer state in the f8 layout
/// (OptimizerStateBlocks) of a tensor of `type`. Every op works along the
/// last dimensions, so the partitioner keeps it on the devices of the
/// stored blocks.
Value decodeBlocks(OpBuilder &builder, Location loc, Value stored,
                   RankedTensorType type) {
  using Blocks = OptimizerStateBlocks;
  auto storedType = cast<RankedTensorType>(stored.getType());
  llvm::ArrayRef<int64_t> storedShape = storedType.getShape();
  int64_t rank = storedType.getRank();
  Type f32 = builder.getF32Type();
  llvm::SmallVector<int64_t> blocksShape(storedShape.drop_back());
  llvm::SmallVector<int64_t> groupShape(blocksShape);
  groupShape.push_back(Blocks::kBlock);
  llvm::SmallVector<int64_t> origin(rank, 0), ones(rank, 1);
  llvm::SmallVector<int64_t> codesEnd(groupShape), scaleStart(origin);
  scaleStart.back() = Blocks::kBlock;
  auto codesType = RankedTensorType::get(groupShape, f32);
  Value codeBytes =
      shlo::buildSlice(builder, loc, stored, origin, codesEnd, ones);
  Value codes = shlo::buildBitcastConvert(
      builder, loc, codeBytes,
      RankedTensorType::get(groupShape,
                            Float8E4M3FNType::get(builder.getContext())));
  Value scaleBytes = shlo::buildSlice(builder, loc, stored, scaleStart,
                                      storedShape, ones);
  Value scale = shlo::buildBitcastConvert(
      builder, loc, scaleBytes, RankedTensorType::get(blocksShape, f32));
  llvm::SmallVector<int64_t> blockDims =
      llvm::to_vector(llvm::seq<int64_t>(0, rank - 1));
  Value roots = shlo::buildElementwise(
      builder, loc, "multiply",
      {shlo::buildConvert(builder, loc, codes, f32),
       shlo::buildBroadcastInDim(builder, loc, scale, codesType, blockDims)});
  // The codes hold sign(x) * sqrt(|x|): x is root * |root|.
  Value values = shlo::buildElementwise(
      builder, loc, "multiply",
      {roots, shlo::buildElementwise(builder, loc, "abs", {roots})});
  int64_t count = type.getNumElements();
  int64_t padded = codesType.getNumElements();
  if (padded != count) { // the flat layout, zero-padded
    Value flat = shlo::buildReshape(builder, loc, values, {padded});
    values = shlo::buildSlice(builder, loc, flat, {0}, {count}, {1});
  }
  return shlo::buildReshape(builder, loc, values, type.getShape());
}

/// `number` (f32) broadcast to `like`.
Value splat(OpBuilder &builder, Location loc, double number,
                   RankedTensorType like) {
  Value scalar =
      shlo::buildScalar(builder, loc, builder.getF32Type(), number);
  return shlo::buildBroadcastScalar(builder, loc, scalar, like);
}

/// `value` (f32) companded, `sign(x) * sqrt(|x|)`, in blocks: reshaped to
/// `groupShape` (blocks..., kBlock), the flat layout zero-padded. The
/// companded values span half the decades `value` does, so more of a
/// block's second moments (squares of gradients spread over many decades)
/// keep their value.
Value groupedRoots(OpBuilder &builder, Location loc, Value value,
                          llvm::ArrayRef<int64_t> groupShape) {
  auto type = cast<RankedTensorType>(value.getType());
  int64_t count = type.getNumElements();
  Value roots = shlo::buildElementwise(
      builder, loc, "multiply",
      {shlo::buildElementwise(builder, loc, "sign", {value}),
       shlo::buildElementwise(
           builder, loc, "sqrt",
           {shlo::buildElementwise(builder, loc, "abs", {value})})});
  int64_t padded = RankedTensorType::get(groupShape, type.getElementType())
                       .getNumElements();
  if (padded != count) { // the flat layout, zero-padded
    Value flat = type.getRank() == 1
                     ? roots
                     : shlo::buildReshape(builder, loc, roots, {count});
    roots = shlo::buildConcatenate(
        builder, loc,
        {flat, splat(builder, loc, 0.0,
                     RankedTensorType::get({padded - count},
                                           builder.getF32Type()))},
        0);
  }
  return shlo::buildReshape(builder, loc, roots, groupShape);
}

/// The E4M3 codes of `scaled` (blocks scaled to at most kMax), as bytes. A
/// nonzero value keeps at least the smallest code: a second moment flushed
/// to zero under a nonzero first moment would make Adam's step explode;
/// rounded up, it only makes that step smaller.
Value codeBytes(OpBuilder &builder, Location loc, Value scaled) {
  using Blocks = OptimizerStateBlocks;
  auto groupType = cast<RankedTensorType>(scaled.getType());
  Value lifted = shlo::buildElementwise(
      builder, loc, "multiply",
      {shlo::buildElementwise(builder, loc, "sign", {scaled}),
       shlo::buildElementwise(
           builder, loc, "maximum",
           {shlo::buildElementwise(builder, loc, "abs", {scaled}),
            splat(builder, loc, Blocks::kSmallest, groupType)})});
  Value clamped = shlo::buildClamp(
      builder, loc, splat(builder, loc, -Blocks::kMax, groupType), lifted,
      splat(builder, loc, Blocks::kMax, groupType));
  auto f8 = Float8E4M3FNType::get(builder.getContext());
  Value codes = shlo::buildConvert(builder, loc, clamped, f8);
  Type u8 = builder.getIntegerType(8, /*isSigned=*/false);
  return shlo::buildBitcastConvert(
      builder, loc, codes, RankedTensorType::get(groupType.getShape(), u8));
}

/// `value` (f32) in the f8 layout (OptimizerStateBlocks): per block, codes
/// rounded to nearest FP8 E4M3 after scaling the block's largest magnitude
/// to kMax, and the scale that undoes it. An all-zero block has scale 0.
Value encodeBlocks(OpBuilder &builder, Location loc, Value value) {
  using Blocks = OptimizerStateBlocks;
  auto type = cast<RankedTensorType>(value.getType());
  llvm::SmallVector<int64_t> storedShape = Blocks::storedShape(type.getShape());
  int64_t rank = storedShape.size();
  llvm::SmallVector<int64_t> blocksShape(
      llvm::ArrayRef<int64_t>(storedShape).drop_back());
  llvm::SmallVector<int64_t> groupShape(blocksShape);
  groupShape.push_back(Blocks::kBlock);
  Type f32 = builder.getF32Type();
  auto groupType = RankedTensorType::get(groupShape, f32);
  auto scaleType = RankedTensorType::get(blocksShape, f32);
  llvm::SmallVector<int64_t> blockDims =
      llvm::to_vector(llvm::seq<int64_t>(0, rank - 1));
  Value grouped = groupedRoots(builder, loc, value, groupShape);
  Value largest = shlo::buildReduce(
      builder, loc, shlo::buildElementwise(builder, loc, "abs", {grouped}),
      {rank - 1}, "maximum", 0.0);
  Value scale = shlo::buildElementwise(
      builder, loc, "divide",
      {largest, splat(builder, loc, Blocks::kMax, scaleType)});
  // 1 where the block is all zero, so nothing divides by 0.
  Value positive = shlo::buildCompare(
      builder, loc, largest, splat(builder, loc, 0.0, scaleType), "GT");
  Value divisor = shlo::buildSelect(builder, loc, positive, scale,
                                    splat(builder, loc, 1.0, scaleType));
  Value scaled = shlo::buildElementwise(
      builder, loc, "divide",
      {grouped, shlo::buildBroadcastInDim(builder, loc, divisor, groupType,
                                          blockDims)});
  llvm::SmallVector<int64_t> scaleBytesShape(blocksShape);
  scaleBytesShape.push_back(Blocks::kScaleBytes);
  Value codes = codeBytes(builder, loc, scaled);
  Value scaleBytes = shlo::buildBitcastConvert(
      builder, loc, scale,
      RankedTensorType::get(scaleBytesShape,
                            builder.getIntegerType(8, /*isSigned=*/false)));
  return shlo::buildConcatenate(builder, loc, {codes, scaleBytes}, rank - 1);
}

/// `low` (bf16) widened to f32 through its bits: the high half of an f32
/// is a bf16. Exact, like a convert, but XLA does not fold it into the
/// convert that made `low` (a convert pair it folds: XLA:CPU computes bf16
/// elementwise ops in f32 and drops the f32 -> bf16 -> f32 round trip), so
/// readers of the widened value read the stored `low` itself.
Value widenThroughBits(OpBuilder &builder, Location loc, Value low) {
  auto type = cast<RankedTensorType>(low.getType());
  Type u16 = builder.getIntegerType(16, /*isSigned=*/false);
  Type u32 = builder.getIntegerType(32, /*isSigned=*/false);
  auto wordsType = cast<RankedTensorType>(shlo::withElementType(type, u32));
  Value halves = shlo::buildBitcastConvert(builder, loc, low,
                                           shlo::withElementType(type, u16));
  Value words = shlo::buildElementwise(
      builder, loc, "shift_left",
      {shlo::buildConvert(builder, loc, halves, u32),
       shlo::buildBroadcastScalar(
           builder, loc, shlo::buildScalar(builder, loc, u32, 16.0),
           wordsType)});
  return shlo::buildBitcastConvert(
      builder, loc, words, shlo::withElementType(type, builder.getF32Type()));
}

/// The other readers of `next`, a moment's new f32 value (Adam's update
/// reads it), read the stored bf16 moment widened back (`stored`) instead:
/// then the stored moment (after amp-loss-scale, the selected state) is
/// the one value the step computes from the old moment. Reading `next`
/// itself, XLA:CPU recomputes it from the old moment in the update's
/// fusion as well as in the fusion that writes the new moment into the
/// donated buffer, and so copies every old moment first. The update then
/// sees the moment as the next step reads it, rounded to bf16 (a relative
/// change of at most 2^-9). `encoding` is the first op that rounds `next`;
/// the widening ends at `stored`.
void readStoredMoment(Value next, Value stored, Operation *encoding,
                      Operation *terminator) {
  // The ops from the encoding to the decoded value read `next` or are new.
  llvm::SmallPtrSet<Operation *, 32> added;
  for (Operation *op = encoding; op; op = op->getNextNode()) {
    added.insert(op);
    if (op == stored.getDefiningOp())
      break;
  }
  next.replaceUsesWithIf(stored, [&](OpOperand &use) {
    return !added.contains(use.getOwner()) && use.getOwner() != terminator;
  });
}

/// Returns result `r` of `main`, the new value of an optimizer state whose
/// `argument` is stored in `dtype` and decoded as `wide`, in that dtype:
/// the argument itself when unchanged, else encoded. Returns the convert
/// that rounds it to bf16, if it is one.
Operation *storeNewValue(OpBuilder &builder, func::FuncOp main, unsigned r,
                         BlockArgument argument, Value wide,
                         OptimizerStateDtype dtype) {
  Location loc = main.getLoc();
  Operation *terminator = main.front().getTerminator();
  builder.setInsertionPoint(terminator);
  Value next = terminator->getOperand(r);
  if (next == wide) { // unchanged: return the argument itself
    terminator->setOperand(r, argument);
    return nullptr;
  }
  if (dtype == OptimizerStateDtype::F8) {
    // The update reads the f32 value, as bitsandbytes' and torchao's 8-bit
    // optimizers do, not the decoded code (whose error, up to 2^-4 of a
    // block's largest root, it would then take every step), at the price
    // of XLA:CPU copying the old blocks (1 byte per moment).
    terminator->setOperand(r, encodeBlocks(builder, loc, next));
    return nullptr;
  }
  // Right after `next`, so the readers that follow can read the stored
  // value instead (readStoredMoment).
  builder.setInsertionPointAfterValue(next);
  Value low = shlo::buildConvert(builder, loc, next, builder.getBF16Type());
  Value stored = widenThroughBits(builder, loc, low);
  terminator->setOperand(r, low);
  if (Operation *def = next.getDefiningOp())
    readStoredMoment(next, stored, def->getNextNode(), terminator);
  return low.getDefiningOp();
}

/// Stores the f32 arguments of `main` marked amp.optimizer_state in
/// `dtype` (bf16, or the f8 layout): each becomes an argument of that type
/// decoded back to f32 where it is read, and its new value (the result
/// marked amp.state_of it) is encoded before the return, bf16 to nearest
/// (see Passes.td). The marker is consumed. Returns the bf16 converts.
llvm::SmallPtrSet<Operation *, 8>
storeOptimizerStateLow(func::FuncOp main, OptimizerStateDtype dtype) {
  llvm::SmallPtrSet<Operation *, 8> roundings;
  OpBuilder builder(main.getContext());
  Type bf16 = builder.getBF16Type();
  Location loc = main.getLoc();
  llvm::SmallVector<Type> inputs(main.getArgumentTypes());
  llvm::SmallVector<Type> results(main.getResultTypes());
  for (unsigned i = 0, e = main.getNumArguments(); i < e; ++i) {
    if (!main.getArgAttr(i, attr::kOptimizerState))
      continue;
    main.removeArgAttr(i, attr::kOptimizerState);
    BlockArgument argument = main.getArgument(i);
    FloatType element = shlo::getFloatElementType(argument.getType());
    auto shaped = dyn_cast<RankedTensorType>(argument.getType());
    if (!element || !element.isF32() || !shaped || !shaped.hasStaticShape() ||
        shaped.getNumElements() == 0)
      continue;
    Type lowType = dtype == OptimizerStateDtype::F8
                       ? Type(blocksType(builder, shaped))
                       : shlo::withElementType(shaped, bf16);
    // Its readers, before the decoding adds its own.
    llvm::SmallVector<OpOperand *> readers;
    for (OpOperand &use : argument.getUses())
      readers.push_back(&use);
    argument.setType(lowType);
    inputs[i] = lowType;
    builder.setInsertionPointToStart(&main.front());
    Value wide = dtype == OptimizerStateDtype::F8
                     ? decodeBlocks(builder, loc, argument, shaped)
                     : shlo::buildConvert(builder, loc, argument,
                                          builder.getF32Type());
    for (OpOperand *reader : readers)
      reader->set(wide);
    for (unsigned r = 0, n = main.getNumResults(); r < n; ++r) {
      auto stateOf = main.getResultAttrOfType<IntegerAttr>(r, attr::kStateOf);
      if (!stateOf || stateOf.getInt() != static_cast<int64_t>(i))
        continue;
      if (Operation *rounding =
              storeNewValue(builder, main, r, argument, wide, dtype))
        roundings.insert(rounding);
      results[r] = lowType;
    }
  }
  main.setFunctionType(
      FunctionType::get(main.getContext(), inputs, results));
  return roundings;
}

/// One round of a 32-bit integer hash (Wellons' lowbias32: a bijection on
/// ui32 whose output bits each flip with probability close to 1/2 when any
/// input bit flips).
Value mixWords(OpBuilder &builder, Location loc, Value words) {
  auto type = cast<RankedTensorType>(words.getType());
  auto constant = [&](double word) {
    return shlo::buildBroadcastScalar(
        builder, loc,
        shlo::buildScalar(builder, loc, type.getElementType(), word), type);
  };
  auto op = [&](llvm::StringRef name, Value lhs, Value rhs) {
    return shlo::buildElementwise(builder, loc, name, {lhs, rhs});
  };
  auto xorShift = [&](Value x, double shift) {
    return op("xor", x, op("shift_right_logical", x, constant(shift)));
  };
  Value x = xorShift(words, 16);
  x = op("multiply", x, constant(0x7feb352d));
  x = xorShift(x, 15);
  x = op("multiply", x, constant(0x846ca68b));
  return xorShift(x, 16);
}

/// 16 random bits per element of `type` (ui32 words below 2^16): a hash of
/// the element's index under `key` (ui32[2], fresh from rng_bit_generator
/// each step and tensor). Elementwise on an iota, so the bits fuse into the
/// update that rounds with them and shard like it: rng_bit_generator's own
/// bits would be a buffer the size of the parameter, which XLA:CPU computes
/// early and keeps until the update. Indices past 2^32 elements wrap.
Value hashedBits(OpBuilder &builder, Location loc, Value key,
                 RankedTensorType type) {
  Type u32 = builder.getIntegerType(32, /*isSigned=*/false);
  auto wordsType = cast<RankedTensorType>(shlo::withElementType(type, u32));
  int64_t count = type.getNumElements();
  Value index = shlo::buildIota(
      builder, loc, RankedTensorType::get({count}, u32), 0);
  if (type.getRank() != 1)
    index = shlo::buildReshape(builder, loc, index, type.getShape());
  auto keyWord = [&](int64_t i) {
    Value word = shlo::buildReshape(
        builder, loc, shlo::buildSlice(builder, loc, key, {i}, {i + 1}, {1}),
        {});
    return shlo::buildBroadcastScalar(builder, loc, word, wordsType);
  };
  Value x = mixWords(builder, loc,
                     shlo::buildElementwise(builder, loc, "xor",
                                            {index, keyWord(0)}));
  x = mixWords(builder, loc,
               shlo::buildElementwise(builder, loc, "add", {x, keyWord(1)}));
  return shlo::buildElementwise(
      builder, loc, "shift_right_logical",
      {x, shlo::buildBroadcastScalar(
              builder, loc, shlo::buildScalar(builder, loc, u32, 16.0),
              wordsType)});
}

/// `value` (f32) rounded to bf16 with `noise`, random ui32 words below
/// 2^16 of its shape: each word is added to the value's bit pattern and the
/// sum cut to its high 16 bits, so it rounds up with probability (the
/// value's low 16 bits) / 2^16. Non-finite values, whose bit pattern must
/// not carry, round to nearest.
Value roundStochastically(OpBuilder &builder, Location loc, Value value,
                          Value noise) {
  auto type = cast<RankedTensorType>(value.getType());
  Type u32 = builder.getIntegerType(32, /*isSigned=*/false);
  Type wordsType = shlo::withElementType(type, u32);
  auto mask = [&](double word) {
    return shlo::buildBroadcastScalar(
        builder, loc, shlo::buildScalar(builder, loc, u32, word),
        cast<RankedTensorType>(wordsType));
  };
  Value words = shlo::buildBitcastConvert(builder, loc, value, wordsType);
  Value sum = shlo::buildElementwise(builder, loc, "add", {words, noise});
  Value cut = shlo::buildElementwise(builder, loc, "and",
                                     {sum, mask(0xFFFF0000u)});
  Value rounded = shlo::buildBitcastConvert(builder, loc, cut, type);
  Value finite = shlo::buildIsFinite(builder, loc, value);
  Value chosen = shlo::buildSelect(builder, loc, finite, rounded, value);
  return shlo::buildConvert(builder, loc, chosen, builder.getBF16Type());
}

class RoundStatePass final
    : public amp::impl::AmpRoundStatePassBase<RoundStatePass> {
public:
  using Base::Base;

  LogicalResult initialize(MLIRContext *context) override {
    options.keep(parseOptions());
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(options.report(module)))
      return signalPassFailure();
    func::FuncOp main = entryFunction(module);
    if (!main) {
      if (!statePairs.empty() || !optimizerStateArgs.empty()) {
        module.emitError() << "amp-round-state: state-results and "
                              "optimizer-state-args name arguments and "
                              "results of a public function 'main', and "
                              "there is none";
        return signalPassFailure();
      }
      return;
    }
    if (failed(markNamedState(main)))
      return signalPassFailure();
    llvm::SmallPtrSet<Operation *, 8> optimizerRoundings;
    if (stateDtype != OptimizerStateDtype::F32) {
      optimizerRoundings = storeOptimizerStateLow(main, stateDtype);
    } else {
      for (unsigned i = 0, e = main.getNumArguments(); i < e; ++i)
        main.removeArgAttr(i, attr::kOptimizerState);
    }
    if (mode == UpdateRounding::Nearest)
      return;
    // Parameters only: the optimizer state stored low keeps its rounding to
    // nearest (see Passes.td).
    SmallVector<RoundedState> converts = roundingConverts(main);
    llvm::erase_if(converts, [&](const RoundedState &rounded) {
      return optimizerRoundings.contains(rounded.convert);
    });
    if (converts.empty())
      return;
    if (mode == UpdateRounding::Kahan)
      compensate(main, converts);
    else
      roundWithKey(main, converts);
  }

private:
  UpdateRounding mode = UpdateRounding::Nearest;
  OptimizerStateDtype stateDtype = OptimizerStateDtype::F32;
  llvm::SmallVector<std::pair<unsigned, unsigned>> statePairs;
  OptionCheck options;

  llvm::Error parseOptions() {
    if (llvm::Error error =
            readOption("rounding", parseUpdateRounding(rounding), mode))
      return error;
    if (llvm::Error error = readOption(
            "optimizer-state", parseOptimizerStateDtype(optimizerState),
            stateDtype))
      return error;
    return parseStateResults(stateResults).moveInto(statePairs);
  }

  /// Marks what the state-results and optimizer-state-args options name,
  /// as a front end would have.
  LogicalResult markNamedState(func::FuncOp main) {
    OpBuilder builder(main.getContext());
    unsigned arguments = main.getNumArguments();
    for (auto [result, argument] : statePairs) {
      if (failed(verifyStateResult(main, result, argument)))
        return failure();
      main.setResultAttr(result, attr::kStateOf,
                         builder.getI64IntegerAttr(argument));
    }
    for (unsigned argument : optimizerStateArgs) {
      if (argument >= arguments)
        return main.emitError()
               << "invalid option 'optimizer-state-args': argument "
               << argument << " of " << arguments;
      main.setArgAttr(argument, attr::kOptimizerState, builder.getUnitAttr());
    }
    return success();
  }

  /// Appends a bf16 compensation buffer per rounded parameter to `main`
  /// (argument and result, `amp.compensation` = the parameter's argument).
  /// Each step adds the buffer to the f32 new value, rounds the sum to
  /// nearest, and keeps what the rounding lost as the buffer's next value:
  ///   sum = new + f32(c);  p = bf16(sum);  c' = bf16(sum - f32(p))
  /// The rounded sum is taken in f32 with reduce_precision, which XLA never
  /// folds; a convert to bf16 and back would be folded into `sum` itself
  /// (simplify-fp-conversions), leaving c' = 0.
  void compensate(func::FuncOp main, ArrayRef<RoundedState> converts) {
    OpBuilder builder(&getContext());
    for (const RoundedState &rounded : converts) {
      Operation *convert = rounded.convert;
      Type lowType = convert->getResult(0).getType();
      Attribute owner = builder.getI64IntegerAttr(rounded.argument);
      BlockArgument buffer =
          appendStateArgument(main, lowType, attr::kCompensation, owner);
      if (!buffer)
        return signalPassFailure();
      Location loc = convert->getLoc();
      builder.setInsertionPoint(convert);
      Value value = convert->getOperand(0);
      Type wideType = builder.getF32Type();
      Value sum = shlo::buildElementwise(
          builder, loc, "add",
          {value, shlo::buildConvert(builder, loc, buffer, wideType)});
      Value roundedSum = shlo::buildReducePrecision(builder, loc, sum,
                                                    builder.getBF16Type());
      Value next = shlo::buildConvert(builder, loc, roundedSum,
                                      builder.getBF16Type());
      Value lost = shlo::buildElementwise(builder, loc, "subtract",
                                          {sum, roundedSum});
      Value nextBuffer = shlo::buildConvert(builder, loc, lost,
                                            builder.getBF16Type());
      convert->getResult(0).replaceAllUsesWith(next);
      convert->erase();

      if (failed(appendStateResult(main, nextBuffer, attr::kCompensation,
                                   owner, buffer.getArgNumber())))
        return signalPassFailure();
    }
  }

  /// Appends the random-bit state and its next value to `main`, and rounds
  /// each convert's value stochastically with bits drawn from it in turn.
  void roundWithKey(func::FuncOp main, ArrayRef<RoundedState> converts) {
    MLIRContext *context = &getContext();
    OpBuilder builder(context);
    Type u32 = builder.getIntegerType(32, /*isSigned=*/false);
    Type u64 = builder.getIntegerType(64, /*isSigned=*/false);
    auto keyType = RankedTensorType::get({4}, u32);
    Attribute unit = builder.getUnitAttr();
    BlockArgument key =
        appendStateArgument(main, keyType, attr::kRoundingKey, unit);
    if (!key)
      return signalPassFailure();
    Location loc = main.getLoc();

    // THREE_FRY's state is ui64[2]: the key's four words, two by two.
    builder.setInsertionPointToStart(&main.front());
    Value pairs = shlo::buildReshape(builder, loc, key, {2, 2});
    Value state = shlo::buildBitcastConvert(
        builder, loc, pairs, RankedTensorType::get({2}, u64));
    for (const RoundedState &entry : converts) {
      Operation *convert = entry.convert;
      builder.setInsertionPoint(convert);
      Value value = convert->getOperand(0);
      auto [next, tensorKey] = shlo::buildRngBitGenerator(
          builder, convert->getLoc(), state, RankedTensorType::get({2}, u32));
      state = next;
      Value noise =
          hashedBits(builder, convert->getLoc(), tensorKey,
                     cast<RankedTensorType>(value.getType()));
      Value rounded = roundStochastically(builder, convert->getLoc(), value,
                                          noise);
      convert->getResult(0).replaceAllUsesWith(rounded);
      convert->erase();
    }

    Operation *terminator = main.front().getTerminator();
    builder.setInsertionPoint(terminator);
    Value nextPairs = shlo::buildBitcastConvert(
        builder, loc, state, RankedTensorType::get({2, 2}, u32));
    Value nextKey = shlo::buildReshape(builder, loc, nextPairs, {4});
    if (failed(appendStateResult(main, nextKey, attr::kRoundingKey, unit,
                                 key.getArgNumber())))
      return signalPassFailure();
  }
};

} // namespace
