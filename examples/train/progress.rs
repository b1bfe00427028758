//! What the training prints: a plain-text burn-train renderer with a few progress lines per
//! epoch and one summary line of the epoch's mean loss and accuracy.

use burn_train::metric::{MetricDefinition, MetricId};
use burn_train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use std::collections::HashMap;
use std::time::Instant;

/// Running sums of the numeric metrics of one split in one epoch.
#[derive(Default)]
struct SplitStats {
    /// Per metric name: the sum of batch value × batch size.
    sums: HashMap<String, f64>,
    /// Items seen so far in this epoch.
    items: usize,
    /// Values of the current batch, waiting for its size.
    pending: Vec<(String, f64)>,
}

impl SplitStats {
    /// Adds the pending values of a batch of `items` items to the sums.
    fn add_batch(&mut self, items: usize) {
        for (name, value) in self.pending.drain(..) {
            *self.sums.entry(name).or_default() += value * items as f64;
        }
        self.items += items;
    }
    /// The mean of metric `name` over the items seen, if any.
    fn mean(&self, name: &str) -> Option<f64> {
        (self.items > 0)
            .then(|| self.sums.get(name).copied().unwrap_or(f64::NAN) / self.items as f64)
    }
    /// "loss … accuracy …" for a progress line.
    fn describe(&self) -> String {
        let loss = self.mean("Loss").unwrap_or(f64::NAN);
        let acc = self.mean("Accuracy").unwrap_or(f64::NAN);
        format!("loss {loss:.4}  accuracy {acc:6.2}%")
    }
}

/// A plain-text renderer for burn-train: a few progress lines per epoch and one summary line
/// with the epoch's mean training and validation loss and accuracy. (burn-train's own renderers
/// are its full-screen TUI, behind the `tui` feature, and a debug dump of every iteration.)
pub struct EpochRenderer {
    /// Metric names by id, as registered by burn-train.
    names: HashMap<MetricId, String>,
    /// Training metrics of the current epoch.
    train: SplitStats,
    /// Validation metrics of the current epoch.
    valid: SplitStats,
    /// The current epoch (1-based).
    epoch: usize,
    /// Training items processed at the previous update, to get each batch's size.
    last_train_items: usize,
    /// Validation items processed at the previous update.
    last_valid_items: usize,
    /// Item count at which the next intermediate progress line is printed.
    next_report: usize,
    /// When the current epoch began.
    epoch_start: Instant,
    /// When training began.
    start: Instant,
}

impl EpochRenderer {
    /// A renderer with nothing recorded yet.
    pub fn new() -> Self {
        Self {
            names: HashMap::new(),
            train: SplitStats::default(),
            valid: SplitStats::default(),
            epoch: 0,
            last_train_items: 0,
            last_valid_items: 0,
            next_report: 0,
            epoch_start: Instant::now(),
            start: Instant::now(),
        }
    }

    /// Keeps a numeric metric value of the current batch.
    fn record(&mut self, state: MetricState, valid: bool) {
        if let MetricState::Numeric(entry, value) = state {
            let name = self
                .names
                .get(&entry.metric_id)
                .cloned()
                .unwrap_or_default();
            let split = if valid {
                &mut self.valid
            } else {
                &mut self.train
            };
            split.pending.push((name, value.current()));
        }
    }
}

impl MetricsRendererTraining for EpochRenderer {
    fn update_train(&mut self, state: MetricState) {
        self.record(state, false);
    }

    fn update_valid(&mut self, state: MetricState) {
        self.record(state, true);
    }

    fn render_train(&mut self, item: TrainingProgress, _indicators: Vec<ProgressType>) {
        let epoch = item.global_progress.items_processed;
        let epochs = item.global_progress.items_total;
        if epoch != self.epoch {
            self.epoch = epoch;
            self.train = SplitStats::default();
            self.valid = SplitStats::default();
            self.last_train_items = 0;
            self.last_valid_items = 0;
            self.next_report = 0;
            self.epoch_start = Instant::now();
        }
        let Some(progress) = item.progress else {
            return;
        };
        let batch = progress
            .items_processed
            .saturating_sub(self.last_train_items);
        self.last_train_items = progress.items_processed;
        self.train.add_batch(batch);
        let total = progress.items_total.max(1);
        if progress.items_processed >= self.next_report && progress.items_processed < total {
            if self.next_report > 0 {
                println!(
                    "  epoch {epoch}/{epochs} [{:>6}/{total}] {}  ({:.1}s)",
                    progress.items_processed,
                    self.train.describe(),
                    self.epoch_start.elapsed().as_secs_f64()
                );
            }
            self.next_report = progress.items_processed + total.div_ceil(4);
        }
    }

    fn render_valid(&mut self, item: TrainingProgress, _indicators: Vec<ProgressType>) {
        let Some(progress) = item.progress else {
            return;
        };
        let batch = progress
            .items_processed
            .saturating_sub(self.last_valid_items);
        self.last_valid_items = progress.items_processed;
        self.valid.add_batch(batch);
        if progress.items_processed >= progress.items_total {
            let epoch = item.global_progress.items_processed;
            let epochs = item.global_progress.items_total;
            println!(
                "epoch {epoch}/{epochs}  train: {}  |  valid: {}  |  {:.1}s (total {:.1}s)",
                self.train.describe(),
                self.valid.describe(),
                self.epoch_start.elapsed().as_secs_f64(),
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

impl MetricsRendererEvaluation for EpochRenderer {
    fn update_test(&mut self, _name: EvaluationName, state: MetricState) {
        self.record(state, true);
    }

    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
}

impl MetricsRenderer for EpochRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}
