# Writes the bytes of a file into a C++ header as an array, so that a
# program carries the file (smol-server's chat page) without reading it at
# run time. Run as a script:
#
#   cmake -DINPUT=page.html -DOUTPUT=page.h -DNAME=page -P embed-file.cmake
#
# The header defines NAME (unsigned char[]) and NAME_size (its byte count).
foreach(var INPUT OUTPUT NAME)
  if(NOT ${var})
    message(FATAL_ERROR "embed-file.cmake: ${var} is not set")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
# Sixteen bytes a line (CMake's regular expressions have no {n}).
string(REPEAT "[0-9a-f][0-9a-f]" 16 line)
string(REGEX REPLACE "(${line})" "\\1\n" hex "${hex}")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPLACE "\n" "\n    " bytes "${bytes}")
get_filename_component(source "${INPUT}" NAME)
file(
  WRITE "${OUTPUT}.tmp"
  "// Generated from ${source} by cmake/embed-file.cmake; do not edit.\n"
  "#pragma once\n#include <cstddef>\n"
  "static const unsigned char ${NAME}[] = {\n    ${bytes}\n};\n"
  "static const std::size_t ${NAME}_size = ${n_bytes};\n")
# Only a changed header is rewritten, so that what includes it is rebuilt
# only when the file changed.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
