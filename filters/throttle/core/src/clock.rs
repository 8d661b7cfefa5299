//! The two clocks a decision may need, read lazily: the monotonic clock
//! (schedules and holds inside one process) and the wall clock (the grid of
//! cluster scope, which must agree across hosts), and the units of time.

/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;

/// Time as the host tells it, in nanoseconds.
pub trait Clock {
    /// Monotonic time, shared by all workers of the process.
    fn mono(&mut self) -> u64;
    /// Wall-clock time since the Unix epoch.
    fn wall(&mut self) -> u64;
}

/// A clock that stands still (tests, and decisions that must see one instant).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fixed {
    pub mono: u64,
    pub wall: u64,
}

impl Clock for Fixed {
    fn mono(&mut self) -> u64 {
        self.mono
    }
    fn wall(&mut self) -> u64 {
        self.wall
    }
}

/// Reads each clock of `inner` at most once.
#[derive(Debug)]
pub struct Once<C> {
    inner: C,
    mono: Option<u64>,
    wall: Option<u64>,
}

impl<C: Clock> Once<C> {
    pub fn new(inner: C) -> Self {
        Once {
            inner,
            mono: None,
            wall: None,
        }
    }
}

impl<C: Clock> Clock for Once<C> {
    fn mono(&mut self) -> u64 {
        let inner = &mut self.inner;
        *self.mono.get_or_insert_with(|| inner.mono())
    }
    fn wall(&mut self) -> u64 {
        let inner = &mut self.inner;
        *self.wall.get_or_insert_with(|| inner.wall())
    }
}
