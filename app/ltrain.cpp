// ltrain: subcommand dispatch only. Everything else lives in the library.
#include <iostream>

int main() {
  std::cout << "ltrain\n";
  return 0;
}
