# flashjit_embed_templates(OUTPUT file ROOT dir FILES ...): turns the device templates into a C++
# source defining flashjit::embedded_templates() (path relative to ROOT -> text), so NVRTC can
# resolve #includes from memory and nothing is read from disk at run time.
function(flashjit_embed_templates)
  cmake_parse_arguments(ARG "" "OUTPUT;ROOT" "FILES" ${ARGN})
  add_custom_command(
    OUTPUT ${ARG_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${ARG_OUTPUT} -DROOT=${ARG_ROOT} "-DFILES=${ARG_FILES}"
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedTemplatesScript.cmake
    DEPENDS ${ARG_FILES} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedTemplatesScript.cmake
    COMMENT "Embedding device templates"
    VERBATIM)
endfunction()
