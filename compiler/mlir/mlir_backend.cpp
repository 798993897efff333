// The MLIR backend's driver: context, target validation, the lowering pipeline, the ABI fix-ups,
// PTX serialization and the fatal-error guard. The kernels themselves are built by gen_*.cpp.
#include "compiler/mlir/mlir_backend.hpp"

#include "compiler/mlir/generators.hpp"
#include "compiler/mlir/nvjitlink.hpp"
#include "compiler/mlir/ptxas_tool.hpp"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/CompilationInterfaces.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/TargetParser/Triple.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <regex>

#ifndef FLASHJIT_LLVM_VERSION
#define FLASHJIT_LLVM_VERSION "unknown"
#endif

extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
}

namespace flashjit::mlirgen {
namespace {

constexpr const char *kTriple = "nvptx64-nvidia-cuda";
constexpr int kOptLevel = 3;
constexpr int kParamsAlign = 8; // fj_*_params hold pointers and int64: 8-byte aligned, as NVRTC declares them
constexpr int kMinSm = 80;      // every flashjit kernel needs sm_80 (bf16 cvt, cp.async, mma.sync bf16)
constexpr int kFa3Sm = 90;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- targets --------------------------------------------------------------------------------

// Lowest PTX ISA (x10) that can target each chip, from the PTX ISA release notes.
int min_ptx_for(int sm, bool arch_specific) {
  switch (sm) {
  case 80: return 70;
  case 86: return 71;
  case 87: return 74;
  case 89: return 78;
  case 90: return arch_specific ? 80 : 78;
  default: return -1;
  }
}

struct ParsedTarget {
  int sm = 0;
  bool arch_specific = false;
  int ptx = 0;
};

Status parse_target(const Target &target, ParsedTarget *out) {
  static const std::regex chip(R"(sm_(\d+)(a?))");
  static const std::regex features(R"(\+ptx(\d+))");
  std::smatch m;
  if (!std::regex_match(target.chip, m, chip))
    return Status::error(FLASHJIT_UNSUPPORTED, "MLIR backend: '" + target.chip + "' is not an sm_<N>[a] chip");
  out->sm = std::stoi(m[1].str());
  out->arch_specific = m[2].length() > 0;
  if (!std::regex_match(target.features, m, features))
    return Status::error(FLASHJIT_UNSUPPORTED, "MLIR backend: features '" + target.features +
                                                   "' are not a single +ptx<N> (the only form we emit)");
  out->ptx = std::stoi(m[1].str());
  return Status::success();
}

// Asks the linked LLVM whether its NVPTX backend knows the chip and the PTX ISA feature.
Status llvm_knows(const Target &target) {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
  });
  const llvm::Triple triple(kTriple);
  std::string error;
  const llvm::Target *nvptx = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!nvptx)
    return Status::error(FLASHJIT_UNSUPPORTED, "MLIR backend: this LLVM has no NVPTX target: " + error);
  // Empty CPU and features here: the real ones could print "not a recognized processor" to stderr.
  std::unique_ptr<llvm::MCSubtargetInfo> info(nvptx->createMCSubtargetInfo(triple, "", ""));
  if (!info || !info->isCPUStringValid(target.chip))
    return Status::error(FLASHJIT_UNSUPPORTED,
                         "MLIR backend: LLVM " FLASHJIT_LLVM_VERSION " does not know the chip " + target.chip);
  const std::string feature = target.features.substr(1); // "ptx80"
  bool known = false;
  for (const llvm::SubtargetFeatureKV &kv : info->getAllProcessorFeatures())
    known |= feature == kv.Key;
  if (!known)
    return Status::error(FLASHJIT_UNSUPPORTED,
                         "MLIR backend: LLVM " FLASHJIT_LLVM_VERSION " does not know the PTX ISA feature " + feature);
  return Status::success();
}

// --- context ----------------------------------------------------------------------------------

void register_everything(mlir::DialectRegistry &registry) {
  registry
      .insert<mlir::arith::ArithDialect, mlir::cf::ControlFlowDialect, mlir::func::FuncDialect, mlir::gpu::GPUDialect,
              mlir::index::IndexDialect, mlir::LLVM::LLVMDialect, mlir::math::MathDialect, mlir::memref::MemRefDialect,
              mlir::NVVM::NVVMDialect, mlir::scf::SCFDialect, mlir::ub::UBDialect, mlir::vector::VectorDialect>();
  // convert-gpu-to-nvvm lowers arith/cf/vector/... through these ConvertToLLVM interfaces.
  mlir::arith::registerConvertArithToLLVMInterface(registry);
  mlir::cf::registerConvertControlFlowToLLVMInterface(registry);
  mlir::registerConvertFuncToLLVMInterface(registry);
  mlir::index::registerConvertIndexToLLVMInterface(registry);
  mlir::registerConvertMathToLLVMInterface(registry);
  mlir::registerConvertMemRefToLLVMInterface(registry);
  mlir::ub::registerConvertUBToLLVMInterface(registry);
  mlir::vector::registerConvertVectorToLLVMInterface(registry);
  mlir::NVVM::registerConvertGpuToNVVMInterface(registry);
  mlir::registerConvertNVVMToLLVMInterface(registry);
  mlir::registerBuiltinDialectTranslation(registry);
  mlir::registerLLVMDialectTranslation(registry);
  mlir::registerNVVMDialectTranslation(registry);
  mlir::registerGPUDialectTranslation(registry);
  mlir::NVVM::registerNVVMTargetInterfaceExternalModels(registry); // #nvvm.target -> serializeToObject
}

// A fresh single-threaded context per compile: every pass then runs on the calling thread, which
// the fatal-error guard below relies on, and no state leaks from one kernel into the next.
struct Session {
  mlir::DialectRegistry registry;
  std::unique_ptr<mlir::MLIRContext> context;
  std::string diagnostics;
  std::unique_ptr<mlir::ScopedDiagnosticHandler> handler;

  Session() {
    register_everything(registry);
    context = std::make_unique<mlir::MLIRContext>(registry, mlir::MLIRContext::Threading::DISABLED);
    context->loadAllAvailableDialects();
    handler = std::make_unique<mlir::ScopedDiagnosticHandler>(context.get(), [this](mlir::Diagnostic &d) {
      diagnostics += d.str() + "\n";
      return mlir::success();
    });
  }
};

// --- fatal-error guard --------------------------------------------------------------------------
// LLVM answers some target/op mismatches (e.g. an intrinsic the chosen PTX ISA lacks) with
// report_fatal_error, which aborts the process. While a compile runs, the handler throws instead;
// libLLVM has unwind tables, so the exception crosses its frames to the catch below (LLVM objects
// on those frames leak, the process lives). One compile at a time: the handler is process-wide.
struct LlvmFatalError {
  std::string reason;
};

void throw_llvm_fatal(void *, const char *reason, bool) {
  throw LlvmFatalError{reason ? reason : "unknown"};
}

std::mutex &llvm_mutex() {
  static std::mutex mutex;
  return mutex;
}

// After a fatal error LLVM's process-wide state may be inconsistent (seen: a later, valid compile in
// the same process freed an invalid pointer), so the MLIR backend refuses further work in this
// process; NVRTC is unaffected.
std::atomic<bool> &llvm_poisoned() {
  static std::atomic<bool> poisoned{false};
  return poisoned;
}

template <typename Body> Status guarded(const std::string &what, Body &&body) {
  std::lock_guard<std::mutex> lock(llvm_mutex());
  if (llvm_poisoned())
    return Status::error(FLASHJIT_COMPILE_ERROR, "MLIR backend: disabled in this process after an earlier LLVM fatal "
                                                 "error; " +
                                                     what + " needs the NVRTC backend or a new process");
  llvm::ScopedFatalErrorHandler handler(throw_llvm_fatal);
  try {
    return body();
  } catch (const LlvmFatalError &e) {
    llvm_poisoned() = true;
    return Status::error(FLASHJIT_COMPILE_ERROR, "MLIR backend: LLVM hit a fatal error while compiling " + what + ": " +
                                                     e.reason + " (recovered; the target cannot express this kernel)");
  }
}

// --- pipeline ---------------------------------------------------------------------------------

std::string print(mlir::Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  return text;
}

Status fail(const std::string &stage, const Session &s) {
  return Status::error(FLASHJIT_COMPILE_ERROR, "MLIR backend: " + stage + " failed:\n" + s.diagnostics);
}

// gpu/scf/arith/vector/nvvm -> llvm + nvvm (the PTX-builder nvvm ops become inline asm).
mlir::LogicalResult lower(mlir::ModuleOp module) {
  mlir::PassManager pm(module.getContext());
  mlir::OpPassManager &gpu = pm.nest<mlir::gpu::GPUModuleOp>();
  gpu.addPass(mlir::createSCFToControlFlowPass());
  mlir::ConvertGpuOpsToNVVMOpsOptions options;
  options.useBarePtrCallConv = true;
  options.indexBitwidth = 64;
  gpu.addPass(mlir::createConvertGpuOpsToNVVMOps(options));
  gpu.addPass(mlir::createConvertNVVMToLLVMPass());
  gpu.addPass(mlir::createCanonicalizerPass());
  gpu.addPass(mlir::createCSEPass());
  gpu.addPass(mlir::createReconcileUnrealizedCastsPass());
  return pm.run(module);
}

// The parameter block goes by value: `llvm.byval = <struct>` + `nvvm.grid_constant` make PTX
// declare `.param .align 8 .b8 <entry>_param_0[N]` and read it with ld.param, the same ABI as
// NVRTC's `const __grid_constant__ fj_*_params p`. (convert-gpu-to-nvvm drops byval from gpu.func
// arguments and grid_constant is only legal on lowered kernels, hence after lowering.)
Status mark_params_by_value(mlir::ModuleOp module, const BuiltKernel &kernel) {
  bool found = false;
  module.walk([&](mlir::LLVM::LLVMFuncOp fn) {
    if (fn.getSymName() != kernel.entry)
      return;
    found = true;
    mlir::Builder b(fn.getContext());
    fn.setArgAttr(kernel.params_argument, mlir::LLVM::LLVMDialect::getByValAttrName(),
                  mlir::TypeAttr::get(kernel.params_type));
    fn.setArgAttr(kernel.params_argument, mlir::LLVM::LLVMDialect::getAlignAttrName(),
                  b.getI64IntegerAttr(kParamsAlign));
    fn.setArgAttr(kernel.params_argument, mlir::NVVM::NVVMDialect::getGridConstantAttrName(), b.getUnitAttr());
    if (kernel.min_ctas > 0) // __launch_bounds__(threads, min_ctas): .minnctapersm
      fn->setAttr(mlir::NVVM::NVVMDialect::getMinctasmAttrName(), b.getI32IntegerAttr(kernel.min_ctas));
  });
  if (!found)
    return Status::error(FLASHJIT_INTERNAL, "MLIR backend: no lowered kernel named " + kernel.entry);
  return Status::success();
}

Status serialize(mlir::gpu::GPUModuleOp module, Session &s, std::string *ptx) {
  auto targets = module.getTargetsAttr();
  auto target = targets && !targets.empty() ? llvm::dyn_cast<mlir::gpu::TargetAttrInterface>(targets[0]) : nullptr;
  if (!target)
    return Status::error(FLASHJIT_INTERNAL, "MLIR backend: gpu.module without an #nvvm.target");
  mlir::gpu::TargetOptions options({}, {}, {}, {}, mlir::gpu::CompilationTarget::Assembly);
  std::optional<llvm::SmallVector<char, 0>> object = target.serializeToObject(module, options);
  if (!object)
    return fail("PTX generation (NVPTX backend)", s);
  ptx->assign(object->begin(), object->end());
  return Status::success();
}

mlir::Attribute nvvm_target(Session &s, const Target &target) {
  return mlir::NVVM::NVVMTargetAttr::getChecked([&] { return mlir::emitError(mlir::UnknownLoc::get(s.context.get())); },
                                                s.context.get(), kOptLevel, llvm::StringRef(kTriple),
                                                llvm::StringRef(target.chip), llvm::StringRef(target.features),
                                                mlir::DictionaryAttr{}, mlir::ArrayAttr{}, true);
}

// Lowers every gpu.module of `module` (already verified) and prints PTX; every kernel of `kernels`
// gets its parameter block marked by value.
Status lower_and_serialize(mlir::ModuleOp module, const std::vector<BuiltKernel> &kernels, Session &s, Stages *out) {
  auto start = Clock::now();
  if (mlir::failed(lower(module)))
    return fail("lowering to LLVM+NVVM", s);
  for (const BuiltKernel &kernel : kernels)
    if (Status st = mark_params_by_value(module, kernel); !st)
      return st;
  if (mlir::failed(mlir::verify(module)))
    return fail("verification of the lowered module", s);
  out->lowered = print(module);
  out->lower_seconds = seconds_since(start);

  start = Clock::now();
  std::string ptx;
  Status st = Status::success();
  module.walk([&](mlir::gpu::GPUModuleOp gpu) {
    std::string one;
    if (st && (st = serialize(gpu, s, &one)))
      ptx += one;
  });
  if (!st)
    return st;
  out->ptx = std::move(ptx);
  out->ptx_seconds = seconds_since(start);
  return Status::success();
}

// A fatal error inside LLVM leaves the context and the module mid-translation; destroying them while
// the exception unwinds frees state LLVM left inconsistent. On that path they are leaked instead
// (the process lives on; one context per failed compile is the price).
Status lower_and_serialize_or_leak(mlir::OwningOpRef<mlir::ModuleOp> &module, const std::vector<BuiltKernel> &kernels,
                                   std::unique_ptr<Session> &session, Stages *out) {
  try {
    return lower_and_serialize(*module, kernels, *session, out);
  } catch (const LlvmFatalError &) {
    (void)module.release();
    (void)session.release();
    throw;
  }
}

Status unsupported_variant(Variant variant) {
  return Status::error(FLASHJIT_UNSUPPORTED,
                       std::string("the MLIR backend does not cover ") + variant_name(variant) + " yet");
}

std::string unsupported_reason(const KernelSpec &spec, Variant variant) {
  switch (variant) {
  case Variant::decode_splitk: return decode_unsupported_reason(spec);
  case Variant::fa2: return fa2_unsupported_reason(spec);
  case Variant::fa3: return fa3_unsupported_reason(spec);
  default: return {};
  }
}

} // namespace

Target target_for(const Arch &arch) {
  const int ptx = min_ptx_for(arch.sm, arch.arch_specific && arch.sm >= kFa3Sm);
  return {arch.nvrtc_target(), ptx > 0 ? "+ptx" + std::to_string(ptx) : ""};
}

Status validate_target(const Target &target, Variant variant) {
  ParsedTarget t;
  if (Status s = parse_target(target, &t); !s)
    return s;
  if (Status s = llvm_knows(target); !s)
    return s;
  const int min_ptx = min_ptx_for(t.sm, t.arch_specific);
  if (min_ptx < 0)
    return Status::error(FLASHJIT_UNSUPPORTED, "MLIR backend: no kernels for " + target.chip +
                                                   " (flashjit targets sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a)");
  if (t.ptx < min_ptx)
    return Status::error(FLASHJIT_UNSUPPORTED, "MLIR backend: PTX ISA " + std::to_string(t.ptx / 10) + "." +
                                                   std::to_string(t.ptx % 10) + " cannot target " + target.chip +
                                                   " (needs +ptx" + std::to_string(min_ptx) + ")");
  if (t.sm < kMinSm)
    return Status::error(FLASHJIT_UNSUPPORTED, std::string(variant_name(variant)) + " needs sm_80 or later");
  if (variant == Variant::fa3 && !(t.sm == kFa3Sm && t.arch_specific))
    return Status::error(FLASHJIT_UNSUPPORTED, "fa3 needs sm_90a (wgmma, setmaxnreg), not " + target.chip);
  return Status::success();
}

bool covers(Variant variant) {
  return variant == Variant::combine || variant == Variant::decode_splitk || variant == Variant::fa2 ||
         variant == Variant::fa3;
}

// The assembler decides the SASS as much as LLVM decides the PTX, so both name the backend.
std::string version_string() {
  const std::string assembler =
      ptxas::path().empty() ? nvjitlink::version_string() + " (relocatable: no ptxas found)" : ptxas::version_string();
  return "mlir " FLASHJIT_LLVM_VERSION " + " + assembler;
}

Status generate(const KernelSpec &spec, const Plan &plan, const Options &options, Stages *out) {
  if (!covers(plan.variant))
    return unsupported_variant(plan.variant);
  if (std::string why = unsupported_reason(spec, plan.variant); !why.empty())
    return Status::error(FLASHJIT_UNSUPPORTED, std::string("the MLIR backend does not cover this ") +
                                                   variant_name(plan.variant) + " spec yet: " + why);
  const Target target = options.use_target ? options.target : target_for(spec.arch);
  return guarded(kernel_name(spec, plan), [&]() -> Status {
    if (!options.skip_validation)
      if (Status s = validate_target(target, plan.variant); !s)
        return s;
    auto session = std::make_unique<Session>();
    Session &s = *session;
    Stages stages;
    auto start = Clock::now();
    mlir::OpBuilder b(s.context.get());
    mlir::Location loc = b.getUnknownLoc();
    mlir::OwningOpRef<mlir::ModuleOp> module = mlir::ModuleOp::create(loc);
    (*module)->setAttr(mlir::gpu::GPUDialect::getContainerModuleAttrName(), b.getUnitAttr());
    b.setInsertionPointToEnd(module->getBody());
    mlir::Attribute nvvm = nvvm_target(s, target);
    if (!nvvm)
      return fail("target attribute " + target.chip + " " + target.features, s);
    auto gpu = mlir::gpu::GPUModuleOp::create(b, loc, "flashjit", llvm::ArrayRef<mlir::Attribute>{nvvm});

    std::vector<BuiltKernel> kernels(1);
    Status built = Status::success();
    switch (plan.variant) {
    case Variant::combine: built = build_combine(gpu, spec, plan, &kernels[0]); break;
    case Variant::decode_splitk: built = build_decode(gpu, spec, plan, &kernels); break;
    case Variant::fa2: built = build_fa2(gpu, spec, plan, &kernels[0]); break;
    case Variant::fa3: built = build_fa3(gpu, spec, plan, &kernels[0]); break;
    default: built = unsupported_variant(plan.variant); break;
    }
    if (!built)
      return built;
    if (mlir::failed(mlir::verify(*module)))
      return fail("verification of the built kernel", s);
    stages.built = print(*module);
    stages.build_seconds = seconds_since(start);
    if (Status st = lower_and_serialize_or_leak(module, kernels, session, &stages); !st)
      return st;
    *out = std::move(stages);
    return Status::success();
  });
}

Status lower_text(const std::string &mlir_text, const Target &target, const Options &options, Stages *out) {
  return guarded("MLIR text", [&]() -> Status {
    if (!options.skip_validation) {
      ParsedTarget t;
      if (Status s = parse_target(target, &t); !s)
        return s;
      if (Status s = llvm_knows(target); !s)
        return s;
    }
    auto session = std::make_unique<Session>();
    Session &s = *session;
    Stages stages;
    auto start = Clock::now();
    mlir::OwningOpRef<mlir::ModuleOp> module =
        mlir::parseSourceString<mlir::ModuleOp>(mlir_text, mlir::ParserConfig(s.context.get()));
    if (!module)
      return fail("parsing", s);
    mlir::Attribute nvvm = nvvm_target(s, target);
    if (!nvvm)
      return fail("target attribute " + target.chip + " " + target.features, s);
    module->walk([&](mlir::gpu::GPUModuleOp gpu) {
      if (!gpu.getTargetsAttr() || gpu.getTargetsAttr().empty())
        gpu.setTargetsAttr(mlir::ArrayAttr::get(s.context.get(), {nvvm}));
    });
    if (mlir::failed(mlir::verify(*module)))
      return fail("verification", s);
    stages.built = print(*module);
    stages.build_seconds = seconds_since(start);
    if (Status st = lower_and_serialize_or_leak(module, {}, session, &stages); !st)
      return st;
    *out = std::move(stages);
    return Status::success();
  });
}

Status compile_with_mlir(const KernelSpec &spec, const Plan &plan, CompiledKernel *out) {
  const auto start = Clock::now();
  Stages stages;
  if (Status s = generate(spec, plan, Options{}, &stages); !s)
    return s;
  CompiledKernel kernel;
  kernel.name = kernel_name(spec, plan);
  kernel.entry = plan.entry;
  kernel.backend = version_string();
  kernel.source = stages.built;
  kernel.ptx = stages.ptx;
  std::string info;
  // Whole-program ptxas, as NVRTC assembles; nvJitLink's relocatable assembly is the fallback (it
  // drops setmaxnreg and serializes wgmma: see ptxas_tool.hpp), named in the log and the backend.
  const bool whole_program = !ptxas::path().empty();
  Status assembled =
      whole_program ? ptxas::assemble(stages.ptx, spec.arch.nvrtc_target(), kernel.name, &kernel.cubin, &info)
                    : nvjitlink::ptx_to_cubin(stages.ptx, spec.arch.nvrtc_target(), kernel.name, &kernel.cubin, &info);
  if (!assembled)
    return assembled;
  kernel.log = whole_program ? info
                             : "no ptxas found (FLASHJIT_PTXAS, CUDA_HOME): assembled by nvJitLink as a relocatable "
                               "unit, where setmaxnreg is ignored and wgmma may be serialized\n" +
                                   info;
  kernel.resources = parse_ptxas_report(info);
  kernel.compile_seconds = seconds_since(start);
  *out = std::move(kernel);
  return Status::success();
}

} // namespace flashjit::mlirgen
