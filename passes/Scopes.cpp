//===- Scopes.cpp - Per-layer overrides by scope path --------------------===//

#include "Scopes.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringExtras.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::amp;

namespace {
constexpr llvm::StringRef kChoiceNames[] = {"f32", "compute", "f8"};
// What report.py strips too (it reads these lists from the contract).
constexpr llvm::StringRef kWrapperNames[] = {
    "jit",       "pjit",       "jvp",
    "transpose", "vmap",       "remat",
    "checkpoint", "custom_jvp_call", "custom_vjp_call",
    "xla_call"};
constexpr llvm::StringRef kDriverNames[] = {
    "main", "module_fn", "_traced", "fun", "flat_fun", "amp_module_call"};

/// `part` without JAX's wrappers: `transpose(jvp(Net))` is `Net`.
llvm::StringRef unwrap(llvm::StringRef part) {
  for (bool changed = true; changed;) {
    changed = false;
    for (llvm::StringRef wrapper : kWrapperNames)
      if (part.starts_with(wrapper) &&
          part.drop_front(wrapper.size()).starts_with("(") &&
          part.ends_with(")")) {
        part = part.drop_front(wrapper.size() + 1).drop_back();
        changed = true;
        break;
      }
  }
  return part;
}

/// How far `pattern` is from `scope`: the edit distance to the path or to
/// any of its parts, whichever is less.
unsigned distance(llvm::StringRef pattern, llvm::StringRef scope) {
  unsigned best = pattern.edit_distance(scope);
  llvm::SmallVector<llvm::StringRef> parts;
  scope.split(parts, '/');
  for (llvm::StringRef part : parts)
    best = std::min(best, pattern.edit_distance(part));
  return best;
}
} // namespace

llvm::ArrayRef<llvm::StringRef> mlir::amp::scopeChoiceNames() {
  return kChoiceNames;
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::scopeWrapperNames() {
  return kWrapperNames;
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::scopeDriverNames() {
  return kDriverNames;
}

std::string mlir::amp::scopePath(Location loc) {
  auto named = dyn_cast<NameLoc>(loc);
  if (!named)
    return "";
  llvm::SmallVector<llvm::StringRef> parts;
  named.getName().getValue().split(parts, '/');
  parts.pop_back(); // the primitive
  llvm::ArrayRef<llvm::StringRef> scoped(parts);
  // The first part, jit(f), names the function the module was lowered from.
  if (!scoped.empty() && (scoped.front().starts_with("jit(") ||
                          scoped.front().starts_with("pjit(")))
    scoped = scoped.drop_front();
  std::string path;
  for (llvm::StringRef part : scoped) {
    part = unwrap(part);
    if (part.empty() || llvm::is_contained(kDriverNames, part))
      continue;
    path += (path.empty() ? "" : "/") + part.str();
  }
  return path;
}

llvm::Expected<ScopeOverrides>
ScopeOverrides::parse(llvm::ArrayRef<std::string> entries) {
  ScopeOverrides parsed;
  for (const std::string &entry : entries) {
    auto [rawPattern, choiceText] = llvm::StringRef(entry).rsplit('=');
    llvm::StringRef pattern = rawPattern.trim();
    if (choiceText.data() == nullptr || pattern.empty())
      return llvm::createStringError(
          "invalid option 'scopes': '" + entry +
          "' is not PATTERN=CHOICE (choices: " +
          llvm::join(scopeChoiceNames(), ", ") + ")");
    const llvm::StringRef *choice =
        llvm::find(kChoiceNames, choiceText.trim());
    if (choice == std::end(kChoiceNames))
      return llvm::createStringError(
          "invalid option 'scopes': unknown choice '" + choiceText +
          "' for '" + pattern + "' (accepted: " +
          llvm::join(scopeChoiceNames(), ", ") + ")");
    auto regex = std::make_shared<llvm::Regex>(pattern);
    std::string why;
    if (!regex->isValid(why))
      return llvm::createStringError("invalid option 'scopes': pattern '" +
                                     pattern +
                                     "' is not a regular expression: " + why);
    if (llvm::any_of(parsed.rules, [&](const ScopeRule &rule) {
          return rule.pattern == pattern;
        }))
      return llvm::createStringError("invalid option 'scopes': pattern '" +
                                     pattern + "' given twice");
    parsed.rules.push_back(
        {pattern.str(),
         static_cast<ScopeChoice>(choice - std::begin(kChoiceNames)),
         std::move(regex)});
  }
  return parsed;
}

bool ScopeOverrides::has(ScopeChoice choice) const {
  return llvm::any_of(rules,
                      [&](const ScopeRule &rule) { return rule.choice == choice; });
}

llvm::SmallVector<const ScopeRule *, 2>
ScopeOverrides::longest(llvm::StringRef path) const {
  llvm::SmallVector<const ScopeRule *, 2> best;
  size_t bestLength = 0;
  if (path.empty())
    return best;
  for (const ScopeRule &rule : rules) {
    llvm::SmallVector<llvm::StringRef, 1> matches;
    if (!rule.regex->match(path, &matches))
      continue;
    size_t length = matches.front().size();
    if (best.empty() || length > bestLength) {
      best.assign({&rule});
      bestLength = length;
    } else if (length == bestLength) {
      best.push_back(&rule);
    }
  }
  return best;
}

const ScopeRule *ScopeOverrides::ruleFor(Operation *op) const {
  if (rules.empty())
    return nullptr;
  llvm::SmallVector<const ScopeRule *, 2> best = longest(scopePath(op->getLoc()));
  return best.empty() ? nullptr : best.front();
}

llvm::Error ScopeOverrides::check(ModuleOp module) const {
  if (rules.empty())
    return llvm::Error::success();
  std::vector<std::string> scopes;
  llvm::StringSet<> seen;
  module.walk([&](Operation *op) {
    std::string path = scopePath(op->getLoc());
    if (!path.empty() && seen.insert(path).second)
      scopes.push_back(path);
  });
  for (const std::string &scope : scopes) {
    llvm::SmallVector<const ScopeRule *, 2> best = longest(scope);
    if (best.size() > 1)
      return llvm::createStringError(
          "invalid option 'scopes': '" + best[0]->pattern + "' and '" +
          best[1]->pattern + "' match scope '" + scope +
          "' equally (the longest match wins): make one of them longer");
  }
  for (const ScopeRule &rule : rules) {
    if (llvm::any_of(scopes, [&](const std::string &scope) {
          return rule.regex->match(scope);
        }))
      continue;
    if (scopes.empty())
      return llvm::createStringError(
          "invalid option 'scopes': pattern '" + rule.pattern +
          "' matches no scope: the module's ops have no named scopes "
          "(jax.named_scope, flax or equinox module paths)");
    std::vector<std::string> nearest = scopes;
    llvm::stable_sort(nearest, [&](const std::string &a, const std::string &b) {
      return distance(rule.pattern, a) < distance(rule.pattern, b);
    });
    nearest.resize(std::min<size_t>(nearest.size(), 3));
    return llvm::createStringError(
        "invalid option 'scopes': pattern '" + rule.pattern +
        "' matches no scope (nearest: " + llvm::join(nearest, ", ") + ")");
  }
  return llvm::Error::success();
}
