"""A real browser for the page's tests: Debian's chromium, headless, through its chromedriver.

Where no chromium (or chromedriver, or selenium) is installed the browser tests are
skipped, with one line saying how to enable them; with ``$CI`` or
:data:`REQUIRE_ENV` set (``.ci/run`` sets both) they fail instead: CI must run them.
"""

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paths import ROOT

if TYPE_CHECKING:
    from ui_server import Server

#: Set to 1 (as .ci/run does) to make a missing browser fail the browser tests.
REQUIRE_ENV = "EFFECTFUL_DURABLE_REQUIRE_BROWSER"
#: Where the tests save their screenshots (default: build/screenshots); ``make
#: screenshots`` points it at docs/source/_static/ui, the copies the docs show.
SCREENSHOTS_ENV = "EFFECTFUL_DURABLE_SCREENSHOTS"

HOW_TO_ENABLE = (
    "browser tests skipped: no chromium, chromedriver or selenium; install them "
    "(apt-get install chromium chromium-driver; pip install -e '.[dev]')"
)

#: A host name the browser resolves to 127.0.0.1 as a DNS rebinding attack would.
FOREIGN_HOST = "rebinding.example"


def find(name: str) -> str | None:
    """The path of the program ``name`` (``/usr/bin`` first, as Debian installs it)."""
    debian = Path("/usr/bin") / name
    return str(debian) if debian.exists() else shutil.which(name)


def unavailable() -> str | None:
    """Why the browser tests cannot run here, or None if they can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return HOW_TO_ENABLE
    if find("chromium") is None or find("chromedriver") is None:
        return HOW_TO_ENABLE
    return None


def required() -> bool:
    """Whether a missing browser must fail the tests (CI) rather than skip them."""
    return bool(os.environ.get("CI") or os.environ.get(REQUIRE_ENV))


def start() -> Any:
    """A headless chromium driven by Selenium, in a fresh profile, 1280 pixels wide.

    Chromium as root needs ``--no-sandbox``; the other switches keep it from
    reaching for the network, which this machine does not have.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = find("chromium") or "chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,1000",
        f"--host-resolver-rules=MAP {FOREIGN_HOST} 127.0.0.1",
        f"--user-data-dir={tempfile.mkdtemp(prefix='ui-chromium-')}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(
        service=Service(find("chromedriver") or "chromedriver"), options=options
    )


def screenshots() -> Path:
    """The directory the tests save their screenshots in (made if missing)."""
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or ROOT / "build" / "screenshots")
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def enter(driver: Any, server: "Server") -> None:
    """Open the printed address: the browser is let in, the token leaves the URL."""
    driver.get(server.url)
    assert "token" not in driver.current_url


def wait_for(driver: Any, condition: Any, seconds: float = 15) -> Any:
    """Wait until ``condition(driver)`` holds (at most ``seconds``); its value.

    An element that a navigation or a live update replaced while the condition read
    it only means: not yet.
    """
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = [StaleElementReferenceException]
    return WebDriverWait(driver, seconds, 0.1, ignored_exceptions=ignored).until(condition)


def text_of(driver: Any) -> str:
    """The text the page shows (a body that a navigation replaced while it was read is
    stale, which :func:`wait_for` waits past)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        return str(driver.find_element("tag name", "body").text)
    except WebDriverException as error:
        # Chromium says this, rather than "stale element", of a body replaced between
        # finding it and reading its text.
        if "does not belong to the document" in str(error.msg):
            raise StaleElementReferenceException(error.msg) from error
        raise


def shot(driver: Any, name: str) -> None:
    """Save a screenshot of the whole page as ``name``.png."""
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    # The window's size counts the browser's own bars, which the page does not get.
    bars = driver.execute_script("return window.outerHeight - window.innerHeight")
    driver.set_window_size(1280, min(max(int(height) + int(bars) + 40, 600), 2400))
    driver.save_screenshot(str(screenshots() / f"{name}.png"))
    driver.set_window_size(1280, 1000)


def shot_of(element: Any, name: str) -> bool:
    """Save a screenshot of one element of the page as ``name``.png, all of it."""
    driver = element.parent
    height = int(element.rect["height"])
    driver.set_window_size(1280, min(max(height + 200, 600), 2400))
    driver.execute_script("arguments[0].scrollIntoView()", element)
    element.screenshot(str(screenshots() / f"{name}.png"))
    driver.set_window_size(1280, 1000)
    return True


def click(driver: Any, how: str, what: str) -> None:
    """Click the element found ``how`` (a Selenium locator), finding it again if a live
    update replaced it meanwhile."""
    wait_for(driver, lambda d: d.find_element(how, what).click() or True)


def texts(driver: Any, selector: str) -> list[str]:
    """The text of each element ``selector`` finds, read in one script (a live update
    may replace them between two calls)."""
    found: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)", selector
    )
    return found
