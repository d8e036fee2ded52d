//! An in-process multiplexer for the engine's driver tests: panes with a status the test sets,
//! An in-process multiplexer for the engine's driver tests: panes with a status the test sets,
//! every submit and Enter press recorded with its (tokio, pausable) time, and scripted failures.
//! It keeps the trait's contract — `NotFound` only for a pane that is affirmatively gone,
//! `Uncertain` only from a call that typed, `watch` reports the current status first, a status
//! change is one event, a closed pane is a `Gone` event — so the engine sees what it would see
//! from herdr or tmux, minus the terminal. Opening a pane gives a new incarnation with no agent
//! status yet (its agent is starting), and opens can be held back or made to fail, to drive a
//! spawn through its slow and failing paths.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use fleetd_core::{AgentStatus, PaneId, TabId, TerminalId, WorkspaceId};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{
    BackendKind, Multiplexer, MuxError, MuxFuture, OpenPane, PaneEvent, PaneInfo, ProcessInfo,
    ServerInfo, SubmitPath, Submitted, TabInfo,
};

/// A scripted failure of the next calls touching a pane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Socket blip: `Transient`.
    Transient,
    /// The input goes in, the answer is lost: `submit` and `press_enter` record what they typed
    /// and fail `Uncertain` (as a herdr that typed and then timed out); other calls work.
    LostAnswer,
    /// Typing calls (`submit`, `press_enter`) fail `Transient` before anything is typed (a
    /// socket that refused the call); reads and watches work.
    TypingRefused,
    /// `submit` never answers and types nothing (a daemon killed while its call was out).
    TypingHangs,
}

/// One submit the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Typed {
    /// When (tokio time).
    pub at: Instant,
    /// Into which pane.
    pub pane: PaneId,
    /// What.
    pub text: String,
}

#[derive(Debug, Default)]
struct Inner {
    panes: BTreeMap<PaneId, PaneInfo>,
    watched: std::collections::BTreeSet<PaneId>,
    faults: BTreeMap<PaneId, Fault>,
    /// Panes whose submits report that the turn started (as herdr's `agent.prompt` does).
    starts: std::collections::BTreeSet<PaneId>,
    list_fails: bool,
    /// `list_panes` calls so far.
    listings: usize,
    typed: Vec<Typed>,
    /// What each pane's input line shows below what was typed (`set_input`).
    input: BTreeMap<PaneId, String>,
    enters: Vec<(Instant, PaneId)>,
    /// Keys typed with `type_keys`, in order.
    keys: Vec<(PaneId, String)>,
    /// Every open request received, in order (counted before any hold).
    opens: Vec<OpenPane>,
    /// Make the next opens fail transiently.
    open_fails: bool,
    /// Panes opened so far (numbers the next one).
    opened: usize,
    /// While true, `close_pane` closes nothing (a pane slow to go, or one that refuses).
    closes_held: bool,
}

/// The fake. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub(crate) struct FakeMux {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<PaneEvent>,
    /// While true, `open_pane` waits before it opens anything.
    hold_opens: Arc<tokio::sync::watch::Sender<bool>>,
    /// While true, `list_panes` lists at once and waits before it answers.
    hold_listings: Arc<tokio::sync::watch::Sender<bool>>,
}

impl FakeMux {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::default(),
            events: broadcast::channel(super::PANE_EVENT_CAPACITY).0,
            hold_opens: Arc::new(tokio::sync::watch::Sender::new(false)),
            hold_listings: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Holds every `list_panes` answer (true) until released (false): the panes are listed when
    /// the call is made, and answered late — a slow listing a pane can open behind.
    pub(crate) fn hold_listings(&self, hold: bool) {
        self.hold_listings.send_replace(hold);
    }

    /// How many `list_panes` calls were made.
    pub(crate) fn listings(&self) -> usize {
        self.lock().listings
    }

    /// Gives pane `id` a shell process, as a listing reports it.
    pub(crate) fn set_shell_pid(&self, id: &str, pid: u32) {
        let pane = PaneId::new(id).expect("pane id");
        if let Some(info) = self.lock().panes.get_mut(&pane) {
            info.shell_pid = Some(pid);
        }
    }

    /// Holds every `open_pane` (true) until released (false): a slow multiplexer.
    pub(crate) fn hold_opens(&self, hold: bool) {
        self.hold_opens.send_replace(hold);
    }

    /// While `hold` is true, `close_pane` answers success and closes nothing.
    pub(crate) fn hold_closes(&self, hold: bool) {
        self.lock().closes_held = hold;
    }

    /// Makes `open_pane` fail transiently (or work again).
    pub(crate) fn opens_fail(&self, fails: bool) {
        self.lock().open_fails = fails;
    }

    /// Every open request so far (held ones included).
    pub(crate) fn opens(&self) -> Vec<OpenPane> {
        self.lock().opens.clone()
    }

    /// Whether pane `id` exists.
    pub(crate) fn has_pane(&self, id: &str) -> bool {
        let pane = PaneId::new(id).expect("pane id");
        self.lock().panes.contains_key(&pane)
    }

    /// Opens the pane an `open_pane` asked for: `w9:pN` (incarnation `t-openN`) in its own tab,
    /// with no agent detected yet.
    fn open(&self, req: &OpenPane) -> Result<PaneInfo, MuxError> {
        let mut inner = self.lock();
        if inner.open_fails {
            return Err(MuxError::transient("layout.apply", "scripted socket blip"));
        }
        inner.opened += 1;
        let n = inner.opened;
        let pane = PaneId::new(format!("w9:p{n}")).expect("pane id");
        let info = PaneInfo {
            pane: pane.clone(),
            terminal: TerminalId::new(format!("t-open{n}")).expect("terminal id"),
            tab: TabId::new(format!("w9:t{n}")).expect("tab id"),
            workspace: WorkspaceId::new("w9").expect("ws"),
            label: req.label.clone(),
            title: None,
            agent: None,
            status: AgentStatus::Unknown,
            shell_pid: None,
            workspace_label: None,
        };
        inner.panes.insert(pane, info.clone());
        Ok(info)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// Opens a pane `id` (incarnation `terminal`) in `tab`, holding an agent with `status`.
    pub(crate) fn add_pane(&self, id: &str, terminal: &str, tab: &str, status: AgentStatus) {
        let pane = PaneId::new(id).expect("pane id");
        let info = PaneInfo {
            pane: pane.clone(),
            terminal: TerminalId::new(terminal).expect("terminal id"),
            tab: TabId::new(tab).expect("tab id"),
            workspace: WorkspaceId::new(tab.split(':').next().unwrap_or("w1")).expect("ws"),
            label: None,
            title: None,
            agent: Some("claude".to_owned()),
            status,
            shell_pid: None,
            workspace_label: None,
        };
        self.lock().panes.insert(pane, info);
    }

    /// Sets a pane's status; a watched pane reports the change.
    pub(crate) fn set_status(&self, id: &str, status: AgentStatus) {
        let pane = PaneId::new(id).expect("pane id");
        let mut inner = self.lock();
        let Some(info) = inner.panes.get_mut(&pane) else {
            return;
        };
        if info.status == status {
            return;
        }
        info.status = status;
        let event = PaneEvent::StatusChanged {
            pane: pane.clone(),
            terminal: info.terminal.clone(),
            status,
        };
        if inner.watched.contains(&pane) {
            let _ = self.events.send(event);
        }
    }

    /// Closes a pane: later calls answer `NotFound`; a watched pane reports `Gone`.
    pub(crate) fn close(&self, id: &str) {
        let pane = PaneId::new(id).expect("pane id");
        let mut inner = self.lock();
        if let Some(info) = inner.panes.remove(&pane)
            && inner.watched.remove(&pane)
        {
            let _ = self.events.send(PaneEvent::Gone {
                pane,
                terminal: Some(info.terminal),
            });
        }
    }

    /// Removes a pane without any event, as if its close was never reported (only a listing or
    /// a call can find out).
    pub(crate) fn vanish(&self, id: &str) {
        let pane = PaneId::new(id).expect("pane id");
        let mut inner = self.lock();
        inner.panes.remove(&pane);
        inner.watched.remove(&pane);
    }

    /// Scripts (or clears) a fault for calls touching pane `id`.
    pub(crate) fn fault(&self, id: &str, fault: Option<Fault>) {
        let pane = PaneId::new(id).expect("pane id");
        match fault {
            Some(f) => self.lock().faults.insert(pane, f),
            None => self.lock().faults.remove(&pane),
        };
    }

    /// Makes submits into pane `id` report that the member's turn started (`started:
    /// Some(true)`, as herdr's `agent.prompt` when it saw `working`), without any status event.
    pub(crate) fn reports_start(&self, id: &str) {
        let pane = PaneId::new(id).expect("pane id");
        self.lock().starts.insert(pane);
    }

    /// Makes `list_panes` fail transiently (or work again).
    pub(crate) fn listing_fails(&self, fails: bool) {
        self.lock().list_fails = fails;
    }

    /// Every submit so far.
    pub(crate) fn typed(&self) -> Vec<Typed> {
        self.lock().typed.clone()
    }

    /// Every submit into pane `id` so far.
    pub(crate) fn typed_into(&self, id: &str) -> Vec<Typed> {
        self.lock()
            .typed
            .iter()
            .filter(|t| t.pane.as_str() == id)
            .cloned()
            .collect()
    }

    /// Shows `line` as the pane's input line, at the bottom of its screen (`None`: none).
    pub(crate) fn set_input(&self, id: &str, line: Option<&str>) {
        let pane = PaneId::new(id).expect("valid pane id");
        let mut inner = self.lock();
        match line {
            Some(line) => inner.input.insert(pane, line.to_owned()),
            None => inner.input.remove(&pane),
        };
    }

    /// How many times Enter was pressed on its own (`press_enter`) in pane `id`.
    pub(crate) fn enters(&self, id: &str) -> usize {
        self.lock()
            .enters
            .iter()
            .filter(|(_, p)| p.as_str() == id)
            .count()
    }

    /// The answer a typing call gets once its input went in.
    fn typing_answer(&self, pane: &PaneId, op: &str) -> Result<(), MuxError> {
        if self.lock().faults.get(pane) == Some(&Fault::LostAnswer) {
            return Err(MuxError::uncertain(op, "scripted: typed, then no answer"));
        }
        Ok(())
    }

    fn typing_refused(&self, pane: &PaneId, op: &str) -> Result<(), MuxError> {
        if self.lock().faults.get(pane) == Some(&Fault::TypingRefused) {
            return Err(MuxError::transient(op, "scripted: refused before typing"));
        }
        Ok(())
    }

    fn get(&self, pane: &PaneId, op: &str) -> Result<PaneInfo, MuxError> {
        let inner = self.lock();
        if inner.faults.get(pane) == Some(&Fault::Transient) {
            return Err(MuxError::transient(op, "scripted socket blip"));
        }
        inner
            .panes
            .get(pane)
            .cloned()
            .ok_or_else(|| MuxError::NotFound {
                what: format!("pane {pane}"),
                code: "pane_not_found".to_owned(),
                message: format!("pane {pane} not found"),
            })
    }
}

fn ready<'a, T: Send + 'a>(value: Result<T, MuxError>) -> MuxFuture<'a, T> {
    Box::pin(async move { value })
}

impl Multiplexer for FakeMux {
    fn kind(&self) -> BackendKind {
        BackendKind::Herdr
    }

    fn ping(&self) -> MuxFuture<'_, ServerInfo> {
        ready(Ok(ServerInfo {
            backend: BackendKind::Herdr,
            version: "fake".to_owned(),
            protocol: Some(20),
        }))
    }

    fn list_panes(&self) -> MuxFuture<'_, Vec<PaneInfo>> {
        let mut inner = self.lock();
        inner.listings += 1;
        let out = if inner.list_fails {
            Err(MuxError::transient("pane.list", "scripted socket blip"))
        } else {
            Ok(inner.panes.values().cloned().collect())
        };
        drop(inner);
        let mut held = self.hold_listings.subscribe();
        Box::pin(async move {
            let _ = held.wait_for(|hold| !hold).await;
            out
        })
    }

    fn list_tabs(&self) -> MuxFuture<'_, Vec<TabInfo>> {
        ready(Err(MuxError::Unsupported("list_tabs".to_owned())))
    }

    fn pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, PaneInfo> {
        ready(self.get(pane, "pane.get"))
    }

    fn process_info<'a>(&'a self, _pane: &'a PaneId) -> MuxFuture<'a, ProcessInfo> {
        ready(Err(MuxError::Unsupported("process_info".to_owned())))
    }

    fn open_pane(&self, req: OpenPane) -> MuxFuture<'_, PaneInfo> {
        self.lock().opens.push(req.clone());
        let mut held = self.hold_opens.subscribe();
        Box::pin(async move {
            // A dropped request drops this future too: nothing is opened then.
            let _ = held.wait_for(|hold| !hold).await;
            self.open(&req)
        })
    }

    fn submit<'a>(&'a self, pane: &'a PaneId, text: &'a str) -> MuxFuture<'a, Submitted> {
        if self.lock().faults.get(pane) == Some(&Fault::TypingHangs) {
            return Box::pin(std::future::pending());
        }
        let result = self.get(pane, "agent.prompt").and_then(|_| {
            self.typing_refused(pane, "agent.prompt")?;
            self.lock().typed.push(Typed {
                at: Instant::now(),
                pane: pane.clone(),
                text: text.to_owned(),
            });
            self.typing_answer(pane, "agent.prompt")?;
            let started = self.lock().starts.contains(pane).then_some(true);
            Ok(Submitted {
                path: SubmitPath::AgentPrompt,
                started,
            })
        });
        ready(result)
    }

    fn press_enter<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        let result = self.get(pane, "agent.send_keys").and_then(|_| {
            self.typing_refused(pane, "agent.send_keys")?;
            self.lock().enters.push((Instant::now(), pane.clone()));
            self.typing_answer(pane, "agent.send_keys")
        });
        ready(result)
    }

    fn type_keys<'a>(&'a self, pane: &'a PaneId, keys: &'a str) -> MuxFuture<'a, ()> {
        let result = self.get(pane, "pane.send_text").and_then(|_| {
            self.typing_refused(pane, "pane.send_text")?;
            self.lock().keys.push((pane.clone(), keys.to_owned()));
            Ok(())
        });
        ready(result)
    }

    fn read_tail<'a>(&'a self, pane: &'a PaneId, _lines: u32) -> MuxFuture<'a, String> {
        // The screen echoes what was typed into the pane, a line each.
        ready(self.get(pane, "pane.read").map(|_| {
            let inner = self.lock();
            let lines: Vec<&str> = inner
                .typed
                .iter()
                .filter(|t| t.pane == *pane)
                .map(|t| t.text.as_str())
                .chain(inner.input.get(pane).map(String::as_str))
                .collect();
            lines.join("\n")
        }))
    }

    fn close_pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        if !self.lock().closes_held {
            self.close(pane.as_str());
        }
        ready(Ok(()))
    }

    fn watch<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        let result = self.get(pane, "events.subscribe").map(|info| {
            // A new watch, or a poke of a running one: the current status goes out on the stream.
            self.lock().watched.insert(pane.clone());
            let _ = self.events.send(PaneEvent::StatusChanged {
                pane: pane.clone(),
                terminal: info.terminal,
                status: info.status,
            });
        });
        ready(result)
    }

    fn unwatch(&self, pane: &PaneId) {
        self.lock().watched.remove(pane);
    }

    fn events(&self) -> broadcast::Receiver<PaneEvent> {
        self.events.subscribe()
    }
}
