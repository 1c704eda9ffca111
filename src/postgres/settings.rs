//! Other extensions' settings, read on every direct write without looking their names up.
//! GetConfigOption finds a setting by name each time (a binary search over some 400 names on
//! 15, a hash probe on 16 and later); for the three that [`super::write::direct_allowed`]
//! reads, that was 4 k instructions of a claim's 90 k.
//!
//! Why remembering where a setting lives gives the value GetConfigOption would:
//! - Only a real definition matters. A placeholder (a value SET before its library is loaded)
//!   belongs to an extension that is not loaded, so no hook of it can see a statement; such a
//!   setting reads as absent, and is looked up again later.
//! - guc.c never frees or moves a real definition, nor the variable it points at, for the life
//!   of the backend: its address, once found, stays right, and the variable always holds the
//!   value in force (SET, SET LOCAL, a function's SET clause, and their rollback all assign it).
//! - A definition can only appear when a library is loaded, and the extensions read here
//!   (pg_stat_statements, auto_explain, pgaudit) install executor hooks as they load. So a name
//!   found absent is looked up again whenever one of the executor's hooks has changed since.

use std::cell::Cell;
use std::ffi::CStr;
use std::ptr;

use pgrx::pg_sys;

use super::version;

/// The executor's hooks, which every extension that watches statements replaces as it loads.
type Hooks = [usize; 5];

fn hooks() -> Hooks {
    // SAFETY: reads backend-local function pointers.
    unsafe {
        [
            pg_sys::ExecutorStart_hook.map_or(0, |f| f as usize),
            pg_sys::ExecutorRun_hook.map_or(0, |f| f as usize),
            pg_sys::ExecutorFinish_hook.map_or(0, |f| f as usize),
            pg_sys::ExecutorEnd_hook.map_or(0, |f| f as usize),
            pg_sys::ExecutorCheckPerms_hook.map_or(0, |f| f as usize),
        ]
    }
}

/// A setting defined by another extension. Declare it in a `thread_local!`.
pub struct Setting {
    name: &'static CStr,
    /// Its real definition once found; null while it has none.
    found: Cell<*mut pg_sys::config_generic>,
    /// The executor's hooks when it was last looked for in vain.
    looked: Cell<Option<Hooks>>,
}

impl Setting {
    pub const fn new(name: &'static CStr) -> Setting {
        Setting { name, found: Cell::new(ptr::null_mut()), looked: Cell::new(None) }
    }

    /// The real definition, if its library is loaded.
    fn definition(&self) -> Option<*mut pg_sys::config_generic> {
        if self.found.get().is_null() {
            let now = hooks();
            if self.looked.get() == Some(now) {
                return None;
            }
            self.looked.set(Some(now));
            // SAFETY: looks a name up in guc.c's tables; a placeholder is not kept.
            let conf = unsafe { version::find_setting(self.name) };
            // SAFETY: a non-null result is a live definition.
            if !conf.is_null() && unsafe { (*conf).flags } & pg_sys::GUC_CUSTOM_PLACEHOLDER as i32 == 0 {
                self.found.set(conf);
            }
        }
        let conf = self.found.get();
        (!conf.is_null()).then_some(conf)
    }

    /// The value of a string setting; None when it is not defined or of another type.
    pub fn string(&self) -> Option<&'static CStr> {
        let conf = self.definition()?;
        // SAFETY: a real PGC_STRING definition is a config_string whose variable holds the
        // current value (NULL is read as empty, as SHOW does), valid until it is next set.
        unsafe {
            if (*conf).vartype != pg_sys::config_type::PGC_STRING {
                return None;
            }
            let value = *(*(conf as *mut pg_sys::config_string)).variable;
            Some(if value.is_null() { c"" } else { CStr::from_ptr(value) })
        }
    }

    /// The value of a boolean setting.
    pub fn boolean(&self) -> Option<bool> {
        let conf = self.definition()?;
        // SAFETY: a real PGC_BOOL definition is a config_bool.
        unsafe {
            ((*conf).vartype == pg_sys::config_type::PGC_BOOL).then(|| *(*(conf as *mut pg_sys::config_bool)).variable)
        }
    }

    /// The value of an integer setting, in its own unit.
    pub fn integer(&self) -> Option<i32> {
        let conf = self.definition()?;
        // SAFETY: a real PGC_INT definition is a config_int.
        unsafe {
            ((*conf).vartype == pg_sys::config_type::PGC_INT).then(|| *(*(conf as *mut pg_sys::config_int)).variable)
        }
    }

    /// The label of an enum setting's value, as SHOW prints it: the first of its options
    /// with that value, as config_enum_lookup_by_value finds it.
    pub fn label(&self) -> Option<&'static CStr> {
        let conf = self.definition()?;
        // SAFETY: a real PGC_ENUM definition is a config_enum, whose options end with a null name.
        unsafe {
            if (*conf).vartype != pg_sys::config_type::PGC_ENUM {
                return None;
            }
            let conf = &*(conf as *mut pg_sys::config_enum);
            let value = *conf.variable;
            let mut option = conf.options;
            while !(*option).name.is_null() {
                if (*option).val == value {
                    return Some(CStr::from_ptr((*option).name));
                }
                option = option.add(1);
            }
            None
        }
    }
}
