# CPU kernels that need vector code are written once and compiled once per
# instruction set; common/cpu_features picks one at run time.
#
# recps_add_isa_variants(TARGET src...) compiles each source three times
# (x86-64) with RECPS_ISA_NS defined to isa_portable, isa_avx2, isa_avx512 and
# the matching -m flags; elsewhere only the portable variant is built.

if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(RECPS_HAVE_X86_KERNELS ON)
  set(RECPS_ISAS portable avx2 avx512)
else()
  set(RECPS_HAVE_X86_KERNELS OFF)
  set(RECPS_ISAS portable)
endif()

set(RECPS_ISA_FLAGS_portable "")
set(RECPS_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(RECPS_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2
    -mfma -mf16c -mprefer-vector-width=512)

function(recps_add_isa_variants target)
  foreach(src IN LISTS ARGN)
    get_filename_component(stem ${src} NAME_WE)
    get_filename_component(abs ${src} ABSOLUTE)
    foreach(isa IN LISTS RECPS_ISAS)
      set(out ${CMAKE_CURRENT_BINARY_DIR}/isa/${stem}_${isa}.cc)
      file(CONFIGURE OUTPUT ${out} CONTENT
           "#define RECPS_ISA_NS isa_${isa}\n#include \"${abs}\"\n" @ONLY)
      target_sources(${target} PRIVATE ${out})
      set_source_files_properties(${out} PROPERTIES
        COMPILE_OPTIONS "${RECPS_ISA_FLAGS_${isa}}")
    endforeach()
  endforeach()
endfunction()
