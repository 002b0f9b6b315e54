# The torch wheel bundles its own fmt (12.x) in its include folder, while Debian's spdlog 1.10 needs the
# fmt 9 it was built with: spdlog's and fmt's headers must be found before torch's. An include folder
# given BEFORE does that, unless it is one the compiler searches last in any case (/usr/include, where
# Debian puts both): GCC drops such a folder from -isystem. Then a folder of links to just spdlog/ and
# fmt/ stands in for it, so the rest of /usr/include keeps its place.
#
#   ltrain_headers_before_torch(OUT_VAR LINKS_DIR)
#
# sets OUT_VAR to the include folders of spdlog::spdlog and fmt::fmt, with LINKS_DIR (made here) in place
# of the compiler's own folders. Used by ltrain's build and by its installed package file.
function(ltrain_headers_before_torch out_var links_dir)
  set(folders "")
  foreach(package IN ITEMS spdlog fmt)
    get_target_property(package_folders ${package}::${package} INTERFACE_INCLUDE_DIRECTORIES)
    foreach(folder IN LISTS package_folders)
      if(folder IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
        file(MAKE_DIRECTORY "${links_dir}")
        if(NOT EXISTS "${links_dir}/${package}")
          file(CREATE_LINK "${folder}/${package}" "${links_dir}/${package}" SYMBOLIC)
        endif()
        list(APPEND folders "${links_dir}")
      else()
        list(APPEND folders "${folder}")
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES folders)
  set(${out_var} "${folders}" PARENT_SCOPE)
endfunction()
