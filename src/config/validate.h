#pragma once
// The checks across keys of a RunConfig (each key's own type and limits are checked as it is
// read): names and paths the system takes, list lengths, and combinations that cannot run.
#include <string>
#include <vector>

#include "ltrain/config/load.h"

namespace ltrain::config {

/// Adds to `problems` a line for each check `loaded` fails (each config_error's: the file that set
/// the key, the key, its value, what to set), so that one run reports every problem.
void validate(const LoadedConfig& loaded, std::vector<std::string>& problems);

}  // namespace ltrain::config
