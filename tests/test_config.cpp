#include <gtest/gtest.h>

#include "ltrain/config/load.h"
