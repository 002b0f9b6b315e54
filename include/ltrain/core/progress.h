#pragma once
// Progress display: a bar redrawn in place on a terminal, plain periodic log lines otherwise.
// It only shows numbers the loop already read at a log interval: it never causes a host sync.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ltrain {

struct ProgressState {
  int64_t epoch = 0;        ///< 1-based
  int64_t epochs = 0;
  int64_t step = 0;         ///< optimizer steps done in the run
  int64_t total_steps = 0;
  int64_t epoch_step = 0;   ///< steps done in this epoch
  int64_t epoch_steps = 0;
  double loss = 0.0;
  double accuracy = 0.0;    ///< fraction in [0, 1]
  double lr = 0.0;
  double images_per_second = 0.0;
  double eta_seconds = 0.0;
};

class Progress {
 public:
  /// `on_terminal`: draw a bar on stderr; otherwise log one line per update (on the JSON console
  /// with the fields event "progress", epoch, epochs, step, total_steps, loss, accuracy, lr,
  /// images_per_second, eta_seconds).
  explicit Progress(bool on_terminal) : on_terminal_(on_terminal) {}
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(const ProgressState& state);
  /// Erases the bar so that a log line can be printed cleanly.
  void clear();

 private:
  bool on_terminal_;
  bool bar_shown_ = false;
};

/// The bar's line for a terminal `columns` wide: epoch, bar and steps, loss and accuracy, LR,
/// img/s, eta; the fields that do not fit are dropped from the right (a line that wrapped would
/// not be redrawn in place), and a first field wider than the terminal is cut. At most
/// columns - 1 characters: some terminals wrap on writing the last column.
std::string progress_line(const ProgressState& state, size_t columns);

/// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

/// True when stderr is a terminal.
bool stderr_is_terminal();

/// The width of the terminal on stderr (TIOCGWINSZ), else $COLUMNS, else 80.
size_t terminal_columns();

}  // namespace ltrain
