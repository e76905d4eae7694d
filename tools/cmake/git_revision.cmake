# Writes OUTPUT, a header defining ATTNSERVE_GIT_REVISION: the environment variable of that name
# when set (the container build copies no .git, so the image build passes it in), else the short
# hash of SOURCE_DIR's checked-out commit, with "+dirty" when tracked files differ from it, else
# "unknown". The attnserve_git_revision target runs this at every build; the header is rewritten
# only when the revision changes, so an unchanged tree recompiles and relinks nothing.
if(DEFINED ENV{ATTNSERVE_GIT_REVISION} AND NOT "$ENV{ATTNSERVE_GIT_REVISION}" STREQUAL "")
  set(revision "$ENV{ATTNSERVE_GIT_REVISION}")
else()
  execute_process(
    COMMAND git -c safe.directory=* -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
    OUTPUT_VARIABLE revision
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE failed
    ERROR_QUIET)
  if(failed OR revision STREQUAL "")
    set(revision "unknown")
  else()
    execute_process(
      COMMAND git -c safe.directory=* -C "${SOURCE_DIR}" diff --quiet HEAD --
      RESULT_VARIABLE dirty
      ERROR_QUIET)
    if(dirty)
      string(APPEND revision "+dirty")
    endif()
  endif()
endif()
string(CONCAT content "// Generated at build time by tools/cmake/git_revision.cmake.\n"
       "#define ATTNSERVE_GIT_REVISION \"${revision}\"\n")
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUTPUT}" "${content}")
endif()
