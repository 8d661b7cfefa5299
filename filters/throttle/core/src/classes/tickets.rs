//! The shared value of a rule's classes ([`Tickets`], one blob per rule at
//! `t3/<rule id>/C`) and every change to it, each one
//! compare-and-swap of the whole value: a ticket handed out, slots granted,
//! a ticket abandoned, a grant passed on.
//!
//! Per class ([`Line`]): `next` tickets handed out, `granted` tickets granted
//! a slot (tickets below it, in ticket order), `abandoned` tickets abandoned
//! before their grant, and the arrivals of the current and the previous
//! [`WINDOW_NS`] (for the arrival rate). Requests waiting for a slot:
//! `next - granted - abandoned`.
//!
//! The value always holds [`MAX`] classes: a configuration change that
//! renumbers classes while old requests still wait (Envoy drains the old
//! configuration) mixes their tickets by index for a moment, which delays
//! some and loses none.

use crate::clock::NS_PER_S;
use crate::config::Class;
use crate::store::{SharedBlob, StoreError, MAX_CAS_ATTEMPTS};

use super::{choose, MAX};
use crate::rate::RateSource as Slots;

/// Length of one arrival-counting window.
pub const WINDOW_NS: u64 = NS_PER_S;

/// Most slots one call grants (bounds the work of one tick).
pub const MAX_GRANTS_PER_CALL: usize = 4096;

const MAGIC: u32 = 0x5443_4c31; // "TCL1"
const LINE_BYTES: usize = 8 + 8 + 4 + 4 + 4;
/// Bytes of an encoded value.
pub const BYTES: usize = 4 + 8 + MAX * LINE_BYTES;

/// One class's tickets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Line {
    /// Tickets handed out (the next ticket's number).
    pub next: u64,
    /// Tickets granted a slot: every ticket below this one.
    pub granted: u64,
    /// Abandoned tickets at or above `granted` (not yet granted).
    pub abandoned: u32,
    /// Arrivals in the current window.
    pub arrived: u32,
    /// Arrivals in the window before it.
    pub arrived_before: u32,
}

impl Line {
    /// Requests waiting for a slot (live tickets not yet granted).
    pub fn waiting(&self) -> u64 {
        self.next
            .saturating_sub(self.granted)
            .saturating_sub(self.abandoned.into())
    }
}

/// The shared value of a rule's classes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tickets {
    /// The arrival window the counts are of (`now / WINDOW_NS`).
    pub window: u64,
    pub lines: [Line; MAX],
}

impl Tickets {
    /// Little-endian: magic u32, window u64, then per class next u64,
    /// granted u64, abandoned u32, arrived u32, arrived_before u32.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BYTES);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&self.window.to_le_bytes());
        for l in &self.lines {
            out.extend_from_slice(&l.next.to_le_bytes());
            out.extend_from_slice(&l.granted.to_le_bytes());
            out.extend_from_slice(&l.abandoned.to_le_bytes());
            out.extend_from_slice(&l.arrived.to_le_bytes());
            out.extend_from_slice(&l.arrived_before.to_le_bytes());
        }
        out
    }

    /// Decodes a value; None if it is not one (read as no tickets).
    pub fn decode(bytes: &[u8]) -> Option<Tickets> {
        if bytes.len() != BYTES {
            return None;
        }
        let mut r = bytes;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, rest) = r.split_at_checked(n)?;
            r = rest;
            Some(head)
        };
        let u32_at = |b: &[u8]| b.try_into().ok().map(u32::from_le_bytes);
        let u64_at = |b: &[u8]| b.try_into().ok().map(u64::from_le_bytes);
        if u32_at(take(4)?)? != MAGIC {
            return None;
        }
        let mut t = Tickets {
            window: u64_at(take(8)?)?,
            ..Tickets::default()
        };
        for l in &mut t.lines {
            l.next = u64_at(take(8)?)?;
            l.granted = u64_at(take(8)?)?;
            l.abandoned = u32_at(take(4)?)?;
            l.arrived = u32_at(take(4)?)?;
            l.arrived_before = u32_at(take(4)?)?;
        }
        Some(t)
    }

    /// Requests waiting per class.
    pub fn waiting(&self) -> [u64; MAX] {
        self.lines.map(|l| l.waiting())
    }

    /// Tickets granted so far, over every class.
    pub fn granted(&self) -> u64 {
        self.lines.iter().map(|l| l.granted).sum()
    }

    /// Grants made since `earlier` was read, counted as requests still
    /// waiting by an admission that read the slots in between: a grant
    /// takes its slot first and marks its ticket after, so a turn reckoned
    /// from the slots read before a grant and the tickets read after it
    /// comes one slot too early; this keeps it on the safe side (a grant
    /// the slots read did see costs one slot too many, never one too few).
    pub fn granted_since(&self, earlier: &Tickets) -> u64 {
        self.granted().saturating_sub(earlier.granted())
    }

    /// Whether any class has requests waiting.
    pub fn anyone_waits(&self) -> bool {
        self.lines.iter().any(|l| l.waiting() > 0)
    }

    /// Counts one arrival of class `c` at `now`, moving the windows on.
    pub fn arrive(&mut self, c: usize, now: u64) {
        let window = now / WINDOW_NS;
        if window != self.window {
            let gap = window.saturating_sub(self.window);
            for l in &mut self.lines {
                l.arrived_before = if gap == 1 { l.arrived } else { 0 };
                l.arrived = 0;
            }
            self.window = window;
        }
        if let Some(l) = self.lines.get_mut(c) {
            l.arrived = l.arrived.saturating_add(1);
        }
    }

    /// Class `c`'s recent arrival rate at `now`, per second: the previous
    /// window's count weighted by the part of it still within one window of
    /// `now`, plus the current window's.
    pub fn arrival_rate(&self, c: usize, now: u64) -> f64 {
        let Some(l) = self.lines.get(c) else {
            return 0.0;
        };
        let window = now / WINDOW_NS;
        let into = (now % WINDOW_NS) as f64 / WINDOW_NS as f64;
        let (before, current) = match window.checked_sub(self.window) {
            Some(0) => (f64::from(l.arrived_before), f64::from(l.arrived)),
            Some(1) => (f64::from(l.arrived), 0.0),
            _ => (0.0, 0.0),
        };
        (before * (1.0 - into) + current) * (NS_PER_S as f64 / WINDOW_NS as f64)
    }
}

/// Reads the value (an absent or foreign value reads as no tickets) and its token.
pub fn load<B: SharedBlob>(blob: &mut B) -> Result<(Tickets, B::Token), StoreError> {
    let (bytes, token) = blob.load()?;
    Ok((
        bytes
            .as_deref()
            .and_then(Tickets::decode)
            .unwrap_or_default(),
        token,
    ))
}

/// Applies `change` with compare-and-swap until it sticks; `change` returns
/// None to store nothing (and the loop ends). Returns the value stored (or
/// last read) and what `change` answered.
pub fn update<B: SharedBlob, T>(
    blob: &mut B,
    mut change: impl FnMut(&mut Tickets) -> Option<T>,
) -> Result<(Tickets, Option<T>), StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (mut t, token) = load(blob)?;
        let Some(out) = change(&mut t) else {
            return Ok((t, None));
        };
        if blob.store(&t.encode(), token)? {
            return Ok((t, Some(out)));
        }
    }
    Err(StoreError(u32::MAX))
}

/// What [`grant_due`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Granted {
    /// The value after the last grant (or as last read).
    pub tickets: Tickets,
    /// Slots granted, per class.
    pub per_class: [u32; MAX],
}

/// Grants every due slot of `slots` to the classes waiting, one at a time
/// ([`choose`]). A slot is taken first, then granted; if its class has no
/// waiter left by then (another worker granted it), the slot goes back.
pub fn grant_due<B: SharedBlob, S: Slots>(
    blob: &mut B,
    slots: &mut S,
    classes: &[Class],
    now: u64,
) -> Result<Granted, StoreError> {
    let mut out = Granted::default();
    let (mut t, _) = load(blob)?;
    for _ in 0..MAX_GRANTS_PER_CALL {
        out.tickets = t;
        if !t.anyone_waits() {
            break;
        }
        let Some(slot) = slots.take_due(now, true, &|_| true)? else {
            break;
        };
        let (after, class) = update(blob, |t| {
            let c = choose(slot, classes, &t.waiting())?;
            let line = t.lines.get_mut(c)?;
            line.granted = line.granted.saturating_add(1);
            Some(c)
        })?;
        t = after;
        out.tickets = t;
        match class {
            Some(c) => {
                if let Some(n) = out.per_class.get_mut(c) {
                    *n += 1;
                }
            }
            None => {
                slots.give_back(Some(slot))?;
                break;
            }
        }
    }
    Ok(out)
}

/// Hands out the next ticket of class `c` (counting the arrival), unless
/// `admit` refuses on the value as read (it sees the value and answers
/// whether to queue). Returns the ticket, or None if refused.
pub fn take_ticket<B: SharedBlob>(
    blob: &mut B,
    c: usize,
    now: u64,
    mut admit: impl FnMut(&Tickets) -> bool,
) -> Result<(Tickets, Option<u64>), StoreError> {
    update(blob, |t| {
        if !admit(t) {
            return None;
        }
        t.arrive(c, now);
        let line = t.lines.get_mut(c)?;
        let ticket = line.next;
        line.next = line.next.saturating_add(1);
        Some(ticket)
    })
}

/// Counts an arrival of class `c` that went at once (its rate matters to the
/// classes below it).
pub fn count_arrival<B: SharedBlob>(blob: &mut B, c: usize, now: u64) -> Result<(), StoreError> {
    update(blob, |t| {
        t.arrive(c, now);
        Some(())
    })
    .map(|_| ())
}

/// What became of an abandoned ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    /// It was the class's next: skipped at once, nothing more to do.
    Skipped,
    /// Counted as abandoned (grants skip it in their count); its holder
    /// keeps it until it is granted or next in line ([`settle`]).
    Counted,
    /// Already granted, not yet released: its holder passes its slot on
    /// ([`settle`]).
    Granted,
}

/// Ticket `ticket` of class `c` is abandoned (its client went away, or it
/// was displaced).
pub fn abandon<B: SharedBlob>(
    blob: &mut B,
    c: usize,
    ticket: u64,
) -> Result<Abandoned, StoreError> {
    let (_, out) = update(blob, |t| {
        let line = t.lines.get_mut(c)?;
        if ticket < line.granted {
            return Some(Abandoned::Granted);
        }
        if ticket == line.granted {
            line.granted = line.granted.saturating_add(1);
            return Some(Abandoned::Skipped);
        }
        line.abandoned = line.abandoned.saturating_add(1);
        Some(Abandoned::Counted)
    })?;
    Ok(out.unwrap_or(Abandoned::Granted))
}

/// What [`settle`] did with an abandoned ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Neither granted nor next in line: nothing done yet.
    NotYet,
    /// Next in line and not granted: skipped (no slot involved).
    Skipped,
    /// Granted: its slot went to the class's next ticket.
    PassedOn,
    /// Granted: its slot went back to the slot source (nobody of the class waits).
    GivenBack,
}

/// An abandoned ticket of class `c` (`counted` if [`abandon`] counted it),
/// settled by its holder on tick: skipped once it is next in line, or, if a
/// grant reached it first, its slot passed on to the class's next live
/// ticket or given back to the slot source. Only its holder moves `granted`
/// past its own ticket without a slot, so a ticket below `granted` that is
/// still abandoned here did receive a slot.
pub fn settle<B: SharedBlob, S: Slots>(
    blob: &mut B,
    slots: &mut S,
    c: usize,
    ticket: u64,
    counted: bool,
) -> Result<(Tickets, Settled), StoreError> {
    let (t, outcome) = update(blob, |t| {
        let line = t.lines.get_mut(c)?;
        if ticket > line.granted {
            return None;
        }
        if counted {
            line.abandoned = line.abandoned.saturating_sub(1);
        }
        if ticket == line.granted {
            line.granted = line.granted.saturating_add(1);
            return Some(Settled::Skipped);
        }
        if line.waiting() > 0 {
            line.granted = line.granted.saturating_add(1);
            Some(Settled::PassedOn)
        } else {
            Some(Settled::GivenBack)
        }
    })?;
    let outcome = outcome.unwrap_or(Settled::NotYet);
    if outcome == Settled::GivenBack {
        slots.give_back(None)?;
    }
    Ok((t, outcome))
}
