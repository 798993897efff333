# Runs scripts/gen_wgmma.py into OUT and fails unless it equals templates/prim/wgmma.cuh.
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/scripts/gen_wgmma.py ${OUT} RESULT_VARIABLE generated)
if(NOT generated EQUAL 0)
  message(FATAL_ERROR "scripts/gen_wgmma.py failed (${generated})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT} ${SOURCE_DIR}/templates/prim/wgmma.cuh
                RESULT_VARIABLE differs)
if(NOT differs EQUAL 0)
  message(FATAL_ERROR "templates/prim/wgmma.cuh differs from what scripts/gen_wgmma.py writes: regenerate it")
endif()
