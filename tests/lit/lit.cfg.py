# lit configuration for the FileCheck tests of xmoec.
# Substitutions: %xmoec (the compiler), FileCheck, mlir-opt, not, %samples.
import os
import lit.formats

config.name = "xmoec"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".xir", ".mlir", ".test"]
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py.in"]
config.test_source_root = os.path.join(config.xm_source_dir, "tests/lit")
config.test_exec_root = os.path.join(config.xm_binary_dir, "tests/lit")
config.substitutions.append(("%xmoec", os.path.join(config.xm_binary_dir, "xmoec")))
config.substitutions.append(("%samples", os.path.join(config.xm_source_dir, "samples")))
config.substitutions.append(("%inputs", os.path.join(config.xm_source_dir, "tests/lit/Inputs")))
config.substitutions.append(("FileCheck", config.xm_filecheck))
config.substitutions.append(("mlir-opt", config.xm_mlir_opt))
config.substitutions.append(("not ", config.xm_not + " "))
for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "HOME", "PATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
